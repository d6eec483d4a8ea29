// What the HY V4 loader makes of a checkpoint directory, as data: the quantization it expects of the
// backbone and of the MTP draft, every problem it finds (collected, not thrown), and the summary that
// `nextn inspect` prints. The rules themselves are documented in docs/checkpoints.md.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/hy_v4/model.h"

namespace nextn {

// The loader's findings. Checkpoint problems land here instead of being thrown, so that one load error
// can list them all and `nextn inspect` can show them without failing.
struct LoadReport {
  std::vector<std::string> infos;     // worth one line each (no "nextn: info:" prefix)
  std::vector<std::string> warnings;  // e.g. one per unknown checkpoint tensor (skipped)
  std::vector<std::string> missing;   // canonical names of needed tensors nothing provided
  std::vector<std::string> errors;    // shape / dtype / quantization problems, each naming its tensor
  std::vector<std::string> notes;     // hints appended to the load error

  // What the names in the checkpoint look like (filled while binding).
  std::vector<std::string> name_forms;     // subset of "hub", "internal", "vllm", in that order
  std::vector<std::string> name_features;  // human-readable details behind name_forms
  std::string mtp_naming;                  // "model.mtp_layers.N", "model.layers.{L+N}", "both" or "none"
  std::vector<int> mtp_layers_found;       // MTP layer indices with at least one tensor (either naming)
  std::string expert_layout;               // "fused", "split", "both" or "none"

  bool ok() const { return missing.empty() && errors.empty(); }
  // The text of the nextn::Error a failed load throws.
  std::string error_message(const std::string& dir) const;
};

// The quantization the loader expects of one part of the model (backbone or MTP draft).
struct QuantScheme {
  bool fp8 = false;                   // block-wise FP8 e4m3 weights with block scales
  int64_t block_out = 0, block_in = 0;
  bool ue8m0 = false;                 // scale_fmt "ue8m0": uint8 scales are E8M0 exponents
  std::vector<std::string> ignored;   // module patterns that must stay unquantized
  std::string source;                 // where this scheme comes from (for messages)
};

struct QuantPlan {
  QuantScheme backbone, draft;
  std::string draft_resolution;  // how mtp_quant_algo was resolved, one line
};

// Resolves quantization_config and mtp_quant_algo (problems go to `report`).
QuantPlan resolve_quant_plan(const HYV4Config& c, LoadReport& report);

// Binds the checkpoint's tensors onto `w` (views into the store; small tensors copied). Never throws for
// checkpoint problems: they are collected in `report`. `w` is only usable when report.ok().
void bind_hy_v4_weights(const HYV4Config& c, const WeightStore& store, HYV4Weights& w, LoadReport& report);

// A tensor holding NaN or inf (for its dtype: f32 / f64 / bf16 / f16 exponent all ones, e4m3 0x7f / 0xff,
// e8m0 and ue8m0 (U8) scales 0xff).
struct NonFiniteTensor {
  std::string name, file, dtype;
  int64_t count = 0;  // values that are NaN or inf
  int64_t first = -1;  // flat index of the first
};

// Reads every value of every float tensor in `store` (and of U8 block scales, read as ue8m0) and lists the
// tensors with non-finite values, in name order. Reads the whole checkpoint: `nextn inspect --scan`.
std::vector<NonFiniteTensor> scan_non_finite(const WeightStore& store);

// Everything `nextn inspect DIR` reports.
struct CheckpointInfo {
  std::string dir;
  bool config_ok = false;
  std::string model_type;
  std::vector<std::string> architectures;
  HYV4Config config;  // valid when config_ok

  // Tensors
  int64_t num_tensors = 0;
  int64_t params = 0;       // elements of all weight tensors (scale tensors excluded)
  int64_t mtp_params = 0;   // of which in MTP layers (either naming)
  int64_t total_bytes = 0;
  std::map<std::string, int64_t> bytes_by_dtype, tensors_by_dtype;

  QuantPlan quant;
  LoadReport report;
  // Bytes of the KV caches (target and MTP layers) of one sequence as long as the context
  // (max_position_embeddings): the most a generation allocates for them (0 when the binding failed).
  double context_cache_bytes = 0;
  bool scanned = false;                   // every value was read (--scan)
  int64_t scanned_tensors = 0;
  std::vector<NonFiniteTensor> non_finite;  // when scanned; each is also an error in `report`
  bool loadable = false;
};

// Opens DIR's config and tensors and runs the loader's binding without keeping the model; with `scan`, also
// reads every value (scan_non_finite) and counts a non-finite one as an error.
CheckpointInfo inspect_checkpoint(const std::string& dir, bool scan = false);
nlohmann::json checkpoint_info_json(const CheckpointInfo& info);
std::string checkpoint_info_text(const CheckpointInfo& info);

}  // namespace nextn
