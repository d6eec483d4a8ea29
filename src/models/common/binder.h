// Binding a checkpoint's tensors onto a model's weight handles, the part every family shares: tensors are
// looked up by canonical name, each is checked for shape, dtype and block-wise FP8 quantization, and every
// problem is recorded in a LoadReport instead of thrown (so that one load error lists them all).
//
// A family's loader derives from TensorBinder: it registers the checkpoint's tensors under the canonical
// names it defines (add), says which QuantScheme applies to a tensor (scheme_for), and may add the other
// names its modules go by in exclusion lists (modules_of) and the names its block scales take (scale_names).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "models/common/load_report.h"
#include "models/common/quant_plan.h"
#include "ops/ops.h"

namespace nextn {

// Under an FP8 scheme, Quantized modules must arrive FP8 unless excluded; Either modules may be FP8 (with a
// block scale) or not. Excluded modules must never be FP8.
enum class Role { Quantized, Either };

// What the quantization check of one weight tensor found.
struct Quant {
  bool ok = true;
  bool fp8 = false;
  const void* scale = nullptr;
  DType scale_dtype = DType::F32;
  int64_t block_out = 0, block_in = 0;
};

// One of the Linears that a checkpoint stores either separately or as one tensor of stacked rows: its name
// (the module's last component), its rows, and where its bias goes (nullptr: it has none).
struct Part {
  const char* name;
  int64_t rows;
  std::vector<float>* bias = nullptr;
};

// A size from config.json, as the messages name it: `value` of field `name` in `file`; `defaulted` when
// config.json leaves it out (transformers' default applies).
struct ConfigField {
  const std::string& file;
  const std::string& name;
  int64_t value;
  bool defaulted;
};

class TensorBinder {
 public:
  TensorBinder(const WeightStore& store, LoadReport& report);
  virtual ~TensorBinder() = default;

  // ---- the name table (filled by the family, before anything is bound)

  // Checkpoint tensor `raw` answers to canonical name `canon`; a second tensor with the same canonical name
  // is an error naming both.
  void add(const std::string& canon, const std::string& raw);
  // KV-cache scales (remapped as vLLM does) and activation input scales: counted for report_skipped_scales,
  // never bound. Returns whether `canon` is one.
  bool skip_activation_scale(const std::string& raw, const std::string& canon);
  // The entries of `q`'s exclusion list, matched as written and as `canonical` renames them.
  void set_exclusions(const QuantScheme& q, const std::function<std::string(const std::string&)>& canonical);

  // ---- lookups

  bool has(const std::string& canon) const { return canon_.count(canon) != 0; }
  // Whether any canonical name starts with `prefix` (e.g. a whole decoder layer).
  bool has_prefix(const std::string& prefix) const;
  // The tensor with this canonical name, not marked as used, or nullptr.
  const TensorView* peek(const std::string& canon) const;
  // The tensor with this canonical name (marked as used), or nullptr.
  const TensorView* take(const std::string& canon);
  // A stored tensor the model does not read (a tied head's copy): marked as used with its block scale, so
  // that it is not reported as unknown. Returns it, or nullptr when absent.
  const TensorView* take_unread(const std::string& wname);
  // The checkpoint's name of a canonical name (itself when absent).
  std::string raw_of(const std::string& canon) const;

  // ---- problems

  void missing(const std::string& name) { r_.missing.push_back(name); }
  void error(const std::string& e) { r_.errors.push_back(e); }

  // ---- checks and small tensors

  // Shape and dtype (F32, BF16, F16, and F8_E4M3 when allow_fp8) of a tensor the model reads.
  bool check(const TensorView* t, const std::vector<int64_t>& shape, bool allow_fp8);
  // A config size against the tensor that shows it: axis `axis` of the rank-`rank` tensor `canon`, when
  // present, should be scale * f.value + offset. A mismatch is one error naming the field (once per field),
  // with the value the tensor implies when it implies one.
  void witness_size(const ConfigField& f, const std::string& canon, size_t rank, size_t axis, int64_t scale = 1,
                    int64_t offset = 0);
  // A 1-D tensor [n] copied to f32 (norms, sinks, gates, biases); empty on any problem.
  std::vector<float> vec(const std::string& name, int64_t n) { return vec_any({name}, n); }
  // A small tensor of any shape (conv kernels) copied to f32, checked like vec(); empty on any problem.
  std::vector<float> small(const std::string& name, const std::vector<int64_t>& shape);
  // A 1-D tensor known under several names (aliases); exactly one may be present. Copied to f32 only once its
  // shape is the checkpoint's (a size from config.json allocates nothing the file does not hold), and checked
  // for NaN / inf (these tensors are small: the copy reads them anyway). Empty on any problem.
  std::vector<float> vec_any(const std::vector<std::string>& names, int64_t n);
  // False (with an error naming the tensor) when a value copied out of tensor t is NaN or infinite.
  bool finite_values(const TensorView* t, const float* v, int64_t n);

  // ---- Linears

  // `prefix`.weight of shape [out, in] (+ FP8 block scale, + `prefix`.bias [out] when `bias` is given).
  Linear linear(const std::string& prefix, int64_t out, int64_t in, Role role, std::vector<float>* bias = nullptr);
  // A weight stored under its full name `wname` (bare tensors without ".weight", embeddings) of module `module`.
  Linear named_linear(const std::string& wname, const std::string& module, int64_t out, int64_t in, Role role);
  // Linears stored either separately (`p`<part>.weight) or as one tensor `p``fused`.weight whose rows are the
  // parts in order (vLLM's stacked parameters); the fused form is viewed with Linear::rows().
  std::vector<Linear> stacked(const std::string& p, const std::string& fused, const std::vector<Part>& parts,
                              int64_t in, Role role);
  // The FP8 rules for weight tensor t of `rows` x `cols` (per leading index when `lead` is {E}): its dtype
  // against scheme q and the exclusion entry `ignored` ("" when none names it), then its one block scale
  // among the candidate names `scales`, of shape lead + [block_count(rows), block_count(cols)].
  Quant quant(const TensorView* t, const QuantScheme& q, const std::string& ignored, Role role,
              const std::vector<std::string>& scales, const std::vector<int64_t>& lead, int64_t rows, int64_t cols);
  // The Linear [out, in] starting elem_offset elements into t (and scale_offset scales into its block scale).
  static Linear make_linear(const TensorView* t, const Quant& q, int64_t out, int64_t in, int64_t elem_offset,
                            int64_t scale_offset);
  // The exclusion-list entry of q that names one of `modules`, or "".
  std::string ignored_by(const std::vector<std::string>& modules, const QuantScheme& q) const;

  // The routed experts under prefix p ("...mlp."): E experts of [I, H] gate / up and [H, I] down, stored per
  // expert (p.experts.{e}.gate_proj.weight ..., or a fused per-expert gate_up_proj) or fused over experts
  // (p.experts.gate_up_proj [E, 2I, H] and p.experts.down_proj [E, H, I], transformers' layout).
  void experts(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& gate,
               std::vector<Linear>& up, std::vector<Linear>& down);

  // ---- when everything is bound

  // A warning for each checkpoint tensor nothing used, "unknown checkpoint tensor 'RAW' (skipped)" followed
  // by hint(RAW).
  void report_unused(const std::function<std::string(const std::string& raw)>& hint);
  // One info line each for the KV-cache scales and the activation scales skip_activation_scale set aside.
  void report_skipped_scales();

 protected:
  // ---- what the family decides

  // The scheme a weight with this canonical name is checked against (backbone or draft, ...).
  virtual const QuantScheme& scheme_for(const std::string& canon) const = 0;
  // Names a module is known by in exclusion lists: canonical, and as in the checkpoint.
  virtual std::vector<std::string> modules_of(const std::string& canon_module, const std::string& raw_weight) const;
  // Candidate names of the block scale of weight `w` (canonical): W.weight_scale_inv / W.weight_scale for
  // W.weight, w_scale_inv / w_scale for a bare tensor; a family adds the forms its checkpoints use.
  virtual std::vector<std::string> scale_names(const std::string& w) const;

  const WeightStore& store_;
  LoadReport& r_;

 private:
  void experts_gate_up(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& gate,
                       std::vector<Linear>& up);
  void experts_down(const std::string& p, int64_t E, int64_t I, int64_t H, std::vector<Linear>& down);
  // The fused tensor's exclusion entry: one naming the fused module or all of its parts ("" when none). An
  // entry naming only some parts is an error (`ok` false): a tensor is quantized as a whole.
  std::string fused_ignored_by(const TensorView* t, const std::string& p, const std::string& fused,
                               const std::vector<Part>& parts, const QuantScheme& q, bool& ok) const;
  // The fused bias `p``fused`.bias [total], cut into the parts that want one.
  void stacked_bias(const std::string& p, const std::string& fused, const std::vector<Part>& parts, int64_t total,
                    std::vector<Linear>& out);
  // The checks of quant() on the block scale s of an FP8 tensor t.
  bool check_scale(const TensorView* t, const TensorView* s, const QuantScheme& q, const std::vector<int64_t>& want,
                   Quant& r);

  std::map<std::string, std::string> canon_;  // canonical -> checkpoint name
  std::set<std::string> used_;
  std::vector<std::pair<std::string, std::string>> kv_scales_;  // checkpoint name, vLLM's remapped name
  int64_t input_scales_ = 0;
  // Per scheme: its exclusion entries, each as written and canonical.
  std::map<const QuantScheme*, std::vector<std::pair<std::string, std::string>>> exclusions_;
  std::set<std::string> witnessed_;  // config fields witness_size reported
};

}  // namespace nextn
