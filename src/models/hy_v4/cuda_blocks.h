// The CUDA backend of HY V4's blocks (blocks.h): weights uploaded once as stored (FP8 stays FP8 with its
// block scales), activations and the KV planes in device memory, the kernels of ops/cuda. The host keeps
// the page tables (a small upload per forward), the MoE routing decisions (the router's logits come back,
// the expert choices go out) and what the engine reads: logits, and hidden states for the drafter.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "models/hy_v4/blocks.h"
#include "models/common/device_memory.h"
#include "models/common/forward_graphs.h"
#include "models/common/tensor_split.h"
#include "models/hy_v4/config.h"
#include "ops/cuda/cuda_collectives.h"
#include "ops/cuda/cuda_nn.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn {

// The router's settings as the device's routing kernel takes them (the host's route_tokens reads the same).
cuda::MoeRouting moe_routing(const HYV4Config& c);

class HYV4CudaBlocks final : public HYV4Blocks {
 public:
  // Which of w's weights go to the device: all, or (a tensor-parallel group's rank 0, whose target layers run
  // on its shard's blocks) all but the target's decoder layers.
  enum class Uploads { kAll, kAllButTargetLayers };
  // Uploads w's weights (throws nextn::Error when there is no usable device or too little memory).
  HYV4CudaBlocks(const HYV4Config& config, const HYV4Weights& w, Uploads uploads = Uploads::kAll);
  ~HYV4CudaBlocks() override;

  void reserve(int64_t rows, int64_t positions, int64_t page_tokens) override;
  void begin(const HYV4RowSpan* spans, size_t count) override;
  void embed_streams(const Linear& embed) override;
  void hyper_pre(const HyperConnectionWeights& hc, const std::vector<float>& norm) override;
  void hc_head(const Linear& fn, const std::vector<float>& base, const std::vector<float>& scale,
               const std::vector<float>& norm) override;
  void mtp_input(const MtpLayerWeights& m, const Linear& embed, DraftRequest* const* requests, size_t count) override;
  void rms_norm(HYV4Act in, const std::vector<float>& weight, HYV4Act out) override;
  void attention(const DecoderLayerWeights& L, size_t layer, HYV4Out out) override;
  size_t ffn(const FfnWeights& F, HYV4Out out) override;
  void finish() override;
  void read_hidden(int64_t first, int64_t rows, float* out) override;
  void logits(const Linear& lm_head, float* out) override;
  void lm_head_rows(const Linear& lm_head, const float* hidden, int64_t rows, float* out, int32_t* argmax,
                    int64_t argmax_rows) override;

  void hold(const Linear& w) override { weights_.add(w); }

  size_t weight_bytes_on_device() const { return weights_.bytes(); }

  // One rank of a tensor-parallel group (docs/parallel.md): config and weights are the rank's shard, comm its
  // device collectives, vocab every rank's vocabulary rows. The attention and MLP / MoE outputs are gathered and
  // summed in rank order before the residual updates; embedding rows come from their owners; logits are
  // gathered whole. With a comm that cannot be recorded (host-staged) the forwards run without graphs.
  void set_tensor_parallel(cuda::DeviceCommunicator* comm, std::vector<UnitRange> vocab);

 private:
  struct Workspace;    // the forward's device buffers
  const Linear& dev(const Linear& w);              // w's device twin (uploaded at construction)
  const float* dev(const std::vector<float>& v);   // likewise for norm weights, biases, sinks
  void upload_weights(const HYV4Weights& w, bool target_layers);
  float* act(HYV4Act a);
  // Grows ws_ for `rows` rows over caches of `positions` (the graphs' workspace: forgetting their graphs).
  void ensure_workspace(int64_t rows, int64_t positions);
  // Where a block's last kernel stores its output (blocks.h, HYV4Out): *y and the sink to store through.
  cuda::OutputSink sink_for(HYV4Out out, float** y);
  void swiglu_mlp(const Linear& g, const Linear& u, const Linear& d, float limit, const float* in, int64_t rows,
                  float* a, float* b, float* out, const cuda::OutputSink& sink = {});
  int64_t topk_stride() const;
  // Tensor parallel: y [S, H] (this rank's part) = the sum over the ranks, then the residual update `out`.
  void reduce_and_deliver(HYV4Out out);

  const HYV4Config& cfg_;
  DeviceWeights weights_;
  KVMirrors mirrors_;
  GraphWorkspaces<Workspace> workspaces_;  // the steps' buffers and longer forwards' (device_memory.h)
  Workspace* ws_ = nullptr;                // the current forward's

  // Forwards as CUDA graphs, by shape (rows, padding included; which forward: the target's or an MTP layer's;
  // forced selections): a shape's second forward is recorded, later ones replay it (the block calls then
  // queue nothing). The kernels' arguments are the workspace's addresses and these sizes; positions, slots,
  // spans, page tables, tokens, h_prev and forced selections are read from the per-forward uploads, which come
  // before. What a forward hands back mid-way (an MTP layer's top-k) is read after the graph, in finish().
  bool skipping() const { return graphs_.skipping(); }
  // At a forward's first block: replay its shape's graph (true: queue nothing), or record or run it.
  bool replay_or_record(uintptr_t which);
  void read_selections();  // the spans' last_topk, from the device
  uint64_t one_off_forwards() const override { return graphs_.one_offs(); }
  ForwardGraphs graphs_;

  // The current forward (begin()): its spans, rows, and the device view of its rows' caches.
  std::vector<HYV4RowSpan> spans_;
  int64_t S_ = 0;  // rows, padding included
  // A forward's rows are padded to a few sizes per doubling (padded_forward_rows, forward_graphs.h), so that
  // its graph replays whatever the round's acceptance and the batch: pad_ rows of a span of their own after the
  // real ones (the target's token 0, an MTP layer's -1: no embedding; positions 0.., their keys in
  // pad_planes_' scratch; nothing reads their outputs).
  int64_t pad_ = 0;
  PaddingPlanes pad_planes_{kMaxPaddingRows};
  bool any_forced_ = false, all_forced_ = false;
  int64_t logit_rows_ = 0;
  cuda::RowCaches rc_;
  const int32_t* real_rows_ = nullptr;  // on the device: the current forward's rows before its padding
  std::vector<int32_t> meta_i32_;  // host staging of the per-forward uploads
  std::vector<int64_t> meta_i64_;
  std::vector<float> host_f32_;   // h_prev rows of an MTP forward [S, H]
  HostRows hidden_rows_;          // the forward's hidden rows read back (read_hidden)
  std::vector<int32_t> host_i32_;  // MTP token ids
  std::vector<int32_t> host_sel_count_, host_sel_;  // read_selections' rows [n] and [n, K]
  LogitRows logit_out_;                             // logits() and lm_head_rows()' read-back (greedy: ids)
  struct ExpertTables {  // a MoE layer's experts, each matrix as one table for grouped launches
    cuda::WeightTable gate, up, down;
    int64_t first = 0;  // the first expert held (a tensor-parallel rank holds a range of them; count: gate.count)
  };
  std::unordered_map<const FfnWeights*, ExpertTables> experts_;

  DeviceRank tp_;  // tensor parallel (set_tensor_parallel; inactive: one rank)
};

}  // namespace nextn
