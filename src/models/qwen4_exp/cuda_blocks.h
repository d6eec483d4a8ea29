// The CUDA backend of Qwen4-Exp's blocks (blocks.h): weights uploaded once as stored (FP8 stays FP8 with its
// block scales), the activations, the QSA layers' KV planes and each sequence's recurrent state slots in device
// memory, the kernels of ops/cuda. The host keeps the page tables and the token history (the PLE n-gram ids are
// hashed there: a small upload per forward with the page tables), and reads back logits, the hidden streams the
// drafter asks for, and the MTP layers' selections. A forward's shape recurring runs as a CUDA graph.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "models/common/device_memory.h"
#include "models/common/forward_graphs.h"
#include "models/common/tensor_split.h"
#include "models/qwen4_exp/blocks.h"
#include "models/qwen4_exp/config.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_recurrent.h"

namespace nextn {

struct Qwen4ExpWeights;

class Qwen4CudaBlocks final : public Qwen4ExpBlocks {
 public:
  // Which of w's weights go to the device: all, or (a tensor-parallel group's rank 0, whose target layers run
  // on its shard's blocks) all but the target's layers.
  enum class Uploads { kAll, kAllButTargetLayers };
  // Uploads w's weights (throws nextn::Error when there is no usable device or too little memory).
  Qwen4CudaBlocks(const Qwen4ExpConfig& config, const Qwen4StateLayout& layout, const Qwen4ExpWeights& w,
                  Uploads uploads = Uploads::kAll);
  ~Qwen4CudaBlocks() override;

  void reserve(int64_t rows, int64_t positions, int64_t page_tokens) override;
  void begin(const Qwen4RowSpan* spans, size_t count) override;
  void embed_streams(const Linear& embed) override;
  void ple_add(const PleWeights& p, int layer) override;
  void gated_residual(const GatedResidualWeights& g, bool inject) override;
  void gdn(const GdnWeights& g, int layer) override;
  void qsa(const QsaWeights& a, size_t cache_layer) override;
  size_t moe(const MoeWeights& m) override;
  void inject() override;
  void mtp_input(const Qwen4MtpWeights& m, const Linear& embed, DraftRequest* const* requests, size_t count) override;
  void read_streams(int64_t first, int64_t rows, float* out) override;
  void logits(const GatedResidualWeights& mixer, const Linear& lm_head, float* out) override;
  void logits_of(const GatedResidualWeights& mixer, const Linear& lm_head, const float* streams, int64_t rows,
                 float* out, int32_t* argmax, int64_t argmax_rows) override;
  void finish() override;
  uint64_t one_off_forwards() const override { return graphs_.one_offs(); }

  void hold(const Linear& w) override { weights_.add(w); }
  size_t weight_bytes_on_device() const;

  // One rank of a tensor-parallel group (docs/parallel.md): config, layout and weights are the rank's shard's
  // (qwen4_exp/sharding.h), comm its device collectives, vocab every rank's vocabulary rows. The Gated DeltaNet,
  // QSA and MoE outputs are gathered and summed in rank order before the injections; embedding rows come from
  // their owners; logits are gathered whole. With a comm that cannot be recorded (host-staged) the forwards
  // run without graphs.
  void set_tensor_parallel(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab);

 private:
  struct Workspace;   // the forward's device buffers
  struct StateSlots;  // recycled device buffers for sequences' recurrent state
  const Linear& dev(const Linear& w) const;
  const float* dev(const std::vector<float>& v) const;
  void upload_weights(const Qwen4ExpWeights& w, bool target_layers);
  void upload_ple_table(const PleWeights& p);
  void ensure_workspace(int64_t rows, int64_t positions);
  void attach_state(Qwen4ExpSequence& seq);
  void upload_rows();
  int64_t fixed_upload_ints(int64_t S, bool forced) const;
  bool replay_or_record(uintptr_t which);
  // X [rows, C·H] -> x [rows, H] (and the injection gates [rows, C] when inj is not null), as cpu_blocks.cpp.
  void mix(const GatedResidualWeights& g, const float* X, int64_t rows, float* x, float* inj);
  const float* final_logits(const GatedResidualWeights& mixer, const Linear& lm_head, const float* X,
                            int64_t rows);
  void read_selections();
  void gdn_rows(const GdnWeights& g, int layer);          // x -> y over this rank's heads
  void qsa_rows(const QsaWeights& a, size_t cache_layer);  // likewise

  const Qwen4ExpConfig& cfg_;
  const Qwen4StateLayout& layout_;
  DeviceWeights weights_;
  std::unordered_map<const PleWeights*, cuda::DeviceLinear> ple_tables_;  // a PLE layer's shards as one table
  struct ExpertTables {
    cuda::WeightTable gate, up, down;
    int64_t first = 0;  // the first expert held (a tensor-parallel rank holds a range)
  };
  std::unordered_map<const MoeWeights*, ExpertTables> experts_;
  std::vector<const PleWeights*> ple_layers_;  // per layer: its PLE weights (null: none)
  KVMirrors mirrors_;
  GraphWorkspaces<Workspace> workspaces_;  // the steps' buffers and longer forwards' (device_memory.h)
  Workspace* ws_ = nullptr;                // the current forward's
  std::shared_ptr<StateSlots> states_;
  ForwardGraphs graphs_;  // forwards by shape (forward_graphs.h); eager for a shape's first run
  DeviceRank tp_;  // tensor parallel (set_tensor_parallel; inactive: one rank)

  // The current forward (begin()): its spans, rows and their device views.
  std::vector<Qwen4RowSpan> spans_;
  int64_t S_ = 0, logit_rows_ = 0;  // (S_: padding included)
  // A forward's rows are padded to a few sizes per doubling (padded_forward_rows, forward_graphs.h), so that
  // its graph replays whatever the round's acceptance and the batch: pad_ rows of a span of their own after the
  // real ones (token 0, positions 0.., their keys in pad_planes_' scratch; no recurrence and no expert runs for
  // them, and nothing reads their outputs).
  int64_t pad_ = 0;
  PaddingPlanes pad_planes_{kMaxPaddingRows};
  const int32_t* real_rows_ = nullptr;  // on the device: the rows before the padding
  bool any_forced_ = false, all_forced_ = false;
  cuda::RowCaches rc_;
  cuda::RecurrentSpans rs_;
  const int32_t* tokens_ = nullptr;          // [S] on the device
  const int32_t* logit_row_ids_ = nullptr;   // [logit_rows_]
  const int32_t* blocks_of_ = nullptr;       // [S] complete QSA blocks a row sees
  const int32_t* block_position_ = nullptr;  // [S] the position of the block a row completes
  const int32_t* forced_count_ = nullptr;    // [S] (-1: not forced)
  const int32_t* forced_from_ = nullptr;     // [S]
  const int32_t* forced_ = nullptr;          // [S, forced_stride_]
  int64_t forced_stride_ = 1;                // a forced selection's most slots (a QSA selection's most)
  std::vector<const int32_t*> ple_ids_;  // per layer: its PLE n-gram table rows [S, ngram heads] (null: none)
  std::vector<int64_t> ple_at_;          // (their offsets in the upload)
  std::vector<int32_t> meta_i32_;  // host staging of the per-forward uploads
  std::vector<int64_t> meta_i64_, ngram_;
  std::vector<float> host_f32_;   // an MTP forward's h_prev rows
  HostRows stream_rows_;          // the forward's streams read back (read_streams)
  std::vector<int32_t> host_sel_count_, host_sel_;  // the spans' last rows' selections (read_selections)
  LogitRows logit_out_;  // the logit rows' read-back (greedy rows as ids)
};

}  // namespace nextn
