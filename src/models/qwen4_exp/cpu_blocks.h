// The CPU backend of Qwen4-Exp's blocks (blocks.h): host activations in buffers grown once, the ops kernels,
// and the thread pool's scheduling (GDN heads, QSA rows over the threads). Every row's values are computed by
// the same instructions whatever the batch: rows only meet in the QSA keys and the recurrent state of their
// own sequence, read in position order.
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "models/common/expert_jobs.h"
#include "models/common/tensor_parallel_rank.h"
#include "models/qwen4_exp/blocks.h"
#include "models/qwen4_exp/config.h"

namespace nextn {

class ThreadPool;

class Qwen4CpuBlocks final : public Qwen4ExpBlocks {
 public:
  Qwen4CpuBlocks(const Qwen4ExpConfig& config, const Qwen4StateLayout& layout, ThreadPool* pool)
      : cfg_(config), layout_(layout), pool_(pool) {}
  ThreadPool* pool() const { return pool_; }
  // Makes these the blocks of one tensor-parallel rank over its shard (sharding.h; config: the shard's): the
  // embedding rows come from their owners, the GDN / QSA and MoE outputs are summed over the ranks in rank
  // order, the logits gathered from every rank's vocabulary part. Every rank calls every block.
  void set_tensor_parallel(Communicator* comm, std::vector<UnitRange> vocab) { tp_.set(comm, std::move(vocab)); }

  void reserve(int64_t rows, int64_t positions, int64_t page_tokens) override;
  void begin(const Qwen4RowSpan* spans, size_t count) override;
  void embed_streams(const Linear& embed) override;
  void ple_add(const PleWeights& p, int layer) override;
  void gated_residual(const GatedResidualWeights& g, bool inject) override;
  void gdn(const GdnWeights& g, int layer) override;
  void qsa(const QsaWeights& a, size_t cache_layer) override;
  size_t moe(const MoeWeights& m) override;
  void inject() override { inject(b_.y.data(), b_.inj.data(), S_, b_.X.data()); }
  void mtp_input(const Qwen4MtpWeights& m, const Linear& embed, DraftRequest* const* requests, size_t count) override;
  void read_streams(int64_t first, int64_t rows, float* out) override;
  void logits(const GatedResidualWeights& mixer, const Linear& lm_head, float* out) override;
  void logits_of(const GatedResidualWeights& mixer, const Linear& lm_head, const float* streams, int64_t rows,
                 float* out, int32_t* argmax, int64_t argmax_rows) override;

 private:
  // The pool when `work` (multiply-adds) is worth a hand-off now, else null (run on the calling thread).
  ThreadPool* pool_for(int64_t work);
  void ensure_rows(int64_t S);
  void ensure_thread_scratch(int64_t positions);
  // The blocks over explicit rows [0, S) of the batch (spans_ says whose rows they are).
  void gated_residual(const GatedResidualWeights& g, const float* X, int64_t S, float* x_out, float* inj_out);
  void inject(const float* y, const float* inj, int64_t S, float* X);  // X[:, c] += inj[c] · y
  void gdn(const GdnWeights& g, int layer, const float* x, int64_t S, float* y);
  void qsa(const QsaWeights& a, size_t cache_layer, const float* x, int64_t S, float* y);
  void moe(const MoeWeights& m, const float* x, int64_t S, float* y);
  void ple(const PleWeights& p, int layer, const float* X, int64_t S, float* out);

  const Qwen4ExpConfig& cfg_;
  const Qwen4StateLayout& layout_;
  ThreadPool* pool_;
  std::vector<Qwen4RowSpan> spans_;
  std::vector<int32_t> row_span_;  // [S] span of each row
  int64_t S_ = 0;
  size_t routed_bytes_ = 0;  // routed expert weights read, ever (moe() returns a call's share)

  // Work buffers (grown, never shrunk: steady decode allocates nothing).
  struct Buffers {
    AlignedFloats X, Xn, x, y, inj, mid, wide, wide2, rows_out;  // [S, C·H] / [S, H] / [S, rank] ...
    AlignedFloats qkv, z, ab, conv, core;                         // GDN: [S, conv_dim], [S, Vd], [S, 2nv], ...
    AlignedFloats q, k, v, iq, attn;                              // QSA projections and head outputs
    AlignedFloats router, eh, eo, shared, sgate;                  // MoE (eh, eo: also MTP input, PLE)
    AlignedFloats gathered, expert_out;                           // [S·k, H] rows grouped by expert, outputs
    AlignedFloats expert_act;                                     // [threads, expert_act_floats] job scratch
    int64_t expert_act_floats = 0;
    std::vector<ExpertJob> jobs;                                  // [E + 1]
    AlignedFloats emb, window;                                    // PLE embeddings, conv windows
    AlignedFloats expert_w, rope, rope1;                          // [S, k], [S, rope dim], [rope dim]
    std::vector<int32_t> expert_ids, expert_rows;
    AlignedFloats thread;                                         // [threads, thread_floats] per-task scratch
    std::vector<int32_t> thread_idx;                              // [threads, thread_ints]
    int64_t thread_floats = 0, thread_ints = 0;
  } b_;
  int64_t max_positions_ = 0;  // largest cache the thread scratch is sized for
  TensorParallelRank tp_;      // tensor parallel (inactive: one rank)
  std::vector<int32_t> tp_ids_;  // ... greedy rows' ids from every rank's best [S]
  std::vector<int64_t> ngram_ids_;  // PLE: one position's n-gram table rows [ngram heads]
  std::vector<int32_t> tokens_;  // [S] the forward's tokens in row order (the parallel embedding's)
};

}  // namespace nextn
