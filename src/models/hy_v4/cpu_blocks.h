// The CPU backend of HY V4's blocks (blocks.h): host activations in a workspace sized once, the ops
// kernels, and the thread pool's scheduling (heads, (row, head) pairs or rows over the threads, expert
// jobs, split thresholds). Results never depend on the scheduling: the kernels are batch invariant.
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "models/common/expert_jobs.h"
#include "models/common/tensor_parallel_rank.h"
#include "models/hy_v4/blocks.h"
#include "models/hy_v4/config.h"

namespace nextn {

class ThreadPool;

// Reusable activation buffers for up to `rows` tokens per forward: sized once, grown only when a
// larger batch arrives, so the decode loop never allocates; 64-byte aligned, so that the kernels read
// their rows in place (ops::matmul copies x rows that straddle cache lines).
struct HYV4Workspace {
  int64_t rows = 0;
  AlignedFloats streams;                    // [S, C, H] hyper-connection streams
  AlignedFloats post_gates;                 // [S, C] iHC post gates of the current sublayer
  AlignedFloats x, xn, y;                   // [S, H]
  AlignedFloats mixes;                      // [S, 2C]
  AlignedFloats q_resid;                    // [S, q_lora]
  AlignedFloats q;                          // [S, heads*qk_head]
  AlignedFloats kv_a;                       // [S, kv_lora + rope]
  AlignedFloats gate;                       // [S, heads*v]
  AlignedFloats attn;                       // [S, heads*v]
  AlignedFloats iq;                         // [S, n_ih*ihd]
  AlignedFloats ik;                         // [S, ihd]
  AlignedFloats iw;                         // [S, n_ih]
  std::vector<int32_t> topk;                // [S, index_topk] selected key positions, ascending
  std::vector<int32_t> topk_count;          // [S]
  AlignedFloats ffn_a, ffn_b;               // [S, max(2I_moe, 2I_dense)], [S, max I]
  AlignedFloats router;                     // [S, E]
  std::vector<int32_t> expert_ids;          // [S, top_k]
  AlignedFloats expert_w;                   // [S, top_k]
  AlignedFloats gathered, expert_out;       // [S*top_k, H] tokens grouped by expert, and their outputs
  std::vector<int32_t> expert_rows;         // [S*top_k] (token, slot) of each gathered row
  std::vector<ExpertJob> expert_jobs;       // [E + 1] used experts, ascending id, then the shared expert
  AlignedFloats expert_scratch;             // [threads, 2, S, I_moe] gate / up of one expert job
  AlignedFloats moe_act;                    // [S*top_k + S, 2, I] gate / up per expert (column-split MoE)
  AlignedFloats shared_out;                 // [S, H] shared expert output
  AlignedFloats rope_cs;                    // [rope/2] cos, [rope/2] sin of one position
  AlignedFloats hidden;                     // [S, H] final hidden state
  AlignedFloats mtp_in;                     // [S, 2H]
  // per-thread attention scratch
  AlignedFloats att_scratch;                // [threads, heads, index_topk] scores of one query row
  AlignedFloats att_q;                      // [S, heads, kv_lora + rope] absorbed queries and rope parts
  AlignedFloats att_o;                      // [S, heads, kv_lora] attention-weighted latents
  AlignedFloats att_v;                      // [S, heads, v_head_dim] head outputs before the gate
  AlignedFloats idx_scratch;                // [S, max_seq] index scores
  AlignedFloats idx_tmp;                    // [S, max_seq] top-k selection scratch
  std::vector<int32_t> sel_rows;            // [S, index_topk] physical KV rows of each row's selection
};

// How the forward spreads work over the threads on this machine. Results never depend on it: tests lower
// the thresholds to 0 to run every threaded path on tiny models.
struct CpuTuning {
  // Work (multiply-adds + weight bytes) below which the indexer, attention and MoE stay on the calling
  // thread instead of spreading over the pool (< 0: the pool's ThreadPool::min_parallel_work()).
  int64_t min_parallel_work = -1;
  // Shared experts of at least this many weight bytes run split over the threads after the routed experts
  // instead of as one more whole-expert job.
  size_t shared_split_bytes = size_t(1) << 20;
};

class HYV4CpuBlocks final : public HYV4Blocks {
 public:
  HYV4CpuBlocks(const HYV4Config& config, ThreadPool* pool) : cfg_(config), pool_(pool) {}

  CpuTuning& tuning() { return tuning_; }
  ThreadPool* pool() const { return pool_; }
  // Makes these the blocks of one tensor-parallel rank (docs/parallel.md), computing over its shard of the
  // weights (sharding.h) with the config of its head count: the embedding rows of its vocabulary are picked
  // from their owners' (vocab: every rank's rows, in rank order), the attention and MLP outputs are summed over
  // the ranks in rank order, and the logits of every rank's vocabulary gathered. Every rank calls every block.
  void set_tensor_parallel(Communicator* comm, std::vector<UnitRange> vocab);

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
  void read_hidden(int64_t first, int64_t rows, float* out) override;
  void logits(const Linear& lm_head, float* out) override;
  void lm_head_rows(const Linear& lm_head, const float* hidden, int64_t rows, float* out, int32_t* argmax,
                    int64_t argmax_rows) override;

 private:
  // The blocks as the seam's first version had them: into x, xn or y, then the output moved (deliver).
  void hyper_pre(const HyperConnectionWeights& hc);   // streams -> x, post gates
  void hyper_post();                                  // streams[s, j] += post[s, j] · y[s]
  void add(HYV4Act into, HYV4Act other);              // into += other
  void attention(const DecoderLayerWeights& L, size_t layer);  // xn -> y
  size_t ffn(const FfnWeights& F);                             // xn -> y
  void deliver(HYV4Out out);                                   // y -> out
  void ensure_workspace(int64_t S, int64_t max_seq);
  void project_logits(const Linear& lm_head, const float* hidden, int64_t rows, float* out);
  // Row stride of the top-k selections: index_topk, but never more than the workspace's positions (a query
  // cannot select more keys than there are).
  int64_t topk_stride() const;
  float* act(HYV4Act a);
  // The pool when `work` (multiply-adds + weight bytes) is worth a hand-off now, else null (run serially).
  ThreadPool* pool_for(int64_t work);
  int64_t min_parallel_work() const;

  const HYV4Config& cfg_;
  ThreadPool* pool_;
  CpuTuning tuning_;
  HYV4Workspace ws_;
  int64_t ws_max_seq_ = 0;
  std::vector<HYV4RowSpan> spans_;  // the current forward's segments
  std::vector<int32_t> row_span_;   // [S] span of each row
  int64_t S_ = 0;                   // rows of the current forward
  // Tensor parallel (inactive: one rank).
  TensorParallelRank tp_;
  std::vector<int32_t> tp_tokens_;  // [S] the forward's tokens, in row order
  std::vector<int32_t> tp_ids_;     // [S] greedy ids of a tensor-parallel forward
};

}  // namespace nextn
