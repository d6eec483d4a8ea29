// HY V4 (Tencent Hy4): MLA attention with a DSA top-k indexer, attention sinks and a sigmoid output
// gate; iHC hyper-connections; dense MLP / MoE layers; FP8-block or bf16/fp32 weights.
//
// One token through the target (shapes for S tokens of one sequence, H = hidden_size, C = hc_mult):
//   embed [S,H] -> streams X [S,C,H] (C copies)
//   per layer: attn_hc(X) -> pre-mix x [S,H], post gates [S,C]
//              x = input_layernorm(x); a = attention(x) [S,H]; X = post ⊗ a + X
//              ffn_hc(X) -> x; x = post_attention_layernorm(x); m = mlp(x); X = post ⊗ m + X
//   hc_head(X) [S,H] -> norm -> hidden [S,H] -> lm_head -> logits [S,V]
// The MTP draft layers reuse the attention and FFN blocks without iHC. The blocks run on a backend
// (blocks.h; the CPU's is cpu_blocks.h): this class builds the forwards from them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/finite.h"
#include "io/safetensors.h"
#include "models/hy_v4/config.h"
#include "models/hy_v4/cpu_blocks.h"
#include "memory/kv_cache.h"
#include "models/common/chained_drafter.h"
#include "models/model.h"
#include "ops/ops.h"

namespace nextn {

class ThreadPool;
class HYV4CudaBlocks;
namespace cuda {
class DeviceCommunicator;
}
struct HYV4Shard;

struct HyperConnectionWeights {  // attn_hc / ffn_hc (fp32, tiny)
  Linear fn;                     // [2C, C*H]
  std::vector<float> base;       // [2C]
  std::vector<float> scale;      // [2]
};

struct IndexerWeights {
  Linear wq_b;                           // [n_ih*ihd, q_lora]
  Linear wk;                             // [ihd, H]
  std::vector<float> k_norm_w, k_norm_b; // [ihd] LayerNorm
  Linear weights_proj;                   // [n_ih, H]
  // An FP8 wk dequantized once at load (BF16 if exact, else F32), which wk points into: shared, so that copies
  // of these weights (a tensor-parallel rank's shard) neither duplicate it nor outlive it.
  std::shared_ptr<std::vector<uint8_t>> wk_dequant;
};

struct AttentionWeights {
  Linear q_a_proj;                  // [q_lora, H]
  std::vector<float> q_a_norm;      // [q_lora]
  Linear q_b_proj;                  // [heads*qk_head, q_lora]
  Linear kv_a_proj;                 // [kv_lora + rope, H]
  std::vector<float> kv_a_norm;     // [kv_lora]
  Linear kv_b_proj;                 // [heads*(nope + v), kv_lora]
  Linear o_proj;                    // [H, heads*v]
  Linear gate_proj;                 // [heads*v, H] sigmoid output gate ("linear_gate" on the hub)
  std::vector<float> sinks;         // [heads] ("learnable_sink_param")
  bool has_indexer = false;         // false: reuses the previous full layer's top-k ("shared")
  IndexerWeights indexer;
  std::vector<float> q_a_bias, kv_a_bias, o_bias;  // attention_bias only
};

struct FfnWeights {
  bool sparse = false;
  // dense MLP, or the shared experts of a MoE layer
  Linear gate_proj, up_proj, down_proj;  // [I,H], [I,H], [H,I]
  bool has_shared = false;
  // MoE
  Linear router;                       // [E, H]
  std::vector<float> e_bias;           // [E] e_score_correction_bias (selection only)
  // Routed experts, one Linear each (views of split [I, H] tensors or row slices of a fused tensor).
  std::vector<Linear> expert_gate;     // E × [I, H]
  std::vector<Linear> expert_up;       // E × [I, H]
  std::vector<Linear> expert_down;     // E × [H, I]
};

struct DecoderLayerWeights {
  HyperConnectionWeights attn_hc, ffn_hc;  // unused by MTP blocks
  std::vector<float> input_norm, post_attn_norm;
  AttentionWeights attn;
  FfnWeights ffn;
};

struct MtpLayerWeights {
  std::vector<float> enorm, hnorm, final_norm;  // [H]
  Linear eh_proj;                               // [H, 2H]: concat(enorm(embed), hnorm(h_prev))
  DecoderLayerWeights block;                    // plain pre-norm block (no iHC), own indexer
};

struct HYV4Weights {
  Linear embed;  // [V, H]
  std::vector<DecoderLayerWeights> layers;
  Linear hc_head_fn;  // [C, C*H]
  std::vector<float> hc_head_base, hc_head_scale;
  std::vector<float> final_norm;
  Linear lm_head;  // [V, H]
  std::vector<MtpLayerWeights> mtp;  // num_nextn_predict_layers (empty: no draft)
};

class HYV4Model;

// One HY V4 sequence: its target KV pages.
class HYV4Sequence : public SequenceState {
 public:
  HYV4Sequence(const HYV4Model* owner, KVCache cache) : owner_(owner), cache_(std::move(cache)) {}
  int64_t length() const override { return cache_.length(); }
  int64_t capacity() const override { return cache_.capacity(); }
  void rollback(int64_t n) override { cache_.truncate(n); }
  KVCache& cache() { return cache_; }
  const HYV4Model* owner() const { return owner_; }

 private:
  const HYV4Model* owner_;
  KVCache cache_;
};

// One sequence's rows of a target forward, over a cache.
struct CacheSegment {
  KVCache* cache = nullptr;
  const int32_t* tokens = nullptr;
  int64_t rows = 0;
  bool all_logits = true;
  int32_t* argmax = nullptr;  // as BatchSegment::argmax
};

class HYV4Model : public Model {
 public:
  // Loads DIR/config.json and the safetensors weights (mmap'd, never copied). Throws nextn::Error
  // naming the file / tensor / field on any problem; missing tensors are listed together.
  HYV4Model(const std::string& model_dir, ThreadPool* pool);
  ~HYV4Model() override;

  const HYV4Config& config() const { return cfg_; }
  const HYV4Weights& weights() const { return w_; }
  int num_mtp_layers() const { return static_cast<int>(w_.mtp.size()); }
  CpuTuning& cpu_tuning() { return cpu_blocks_->tuning(); }
  const std::string& dir() const { return dir_; }
  ThreadPool* pool() const { return cpu_blocks_->pool(); }
  ThreadPool* host_pool() const override { return pool(); }

  // ---- Model
  const ModelFacts& facts() const override { return facts_; }
  // Reads every weight once, so that the first token does not pay for page faults, and throws nextn::Error
  // naming the first tensor that holds a NaN or inf (by its stored dtype); with `progress` and a terminal on
  // stderr, large checkpoints show a progress bar.
  void prefault(bool progress) const override;
  bool runs_on(Device) const override { return true; }
  void use_device(Device device) override;
  // This model as rank comm.rank() of a tensor-parallel group (sharding.h): its target forwards compute over
  // its shard and meet the other ranks in comm's collectives; MTP forwards stay whole and local (rank 0's).
  void make_tensor_parallel_rank(Communicator& comm) override;
  void check_tensor_parallel(int ranks) const override;
  bool shards_on(Device) const override { return true; }
  std::string collectives() const override;
  Device device() const override { return device_; }
  void configure_memory(const MemoryOptions& options) override;
  bool can_admit(int64_t capacity, bool drafting) const override;
  bool could_ever_admit(int64_t capacity, bool drafting) const override;
  std::string memory_summary() const override;
  double kv_usage() const override;
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override;
  std::unique_ptr<DraftSession> new_draft_session(SequenceState& sequence, const DraftOptions& options) override;
  void reserve_batch(int64_t rows, int64_t positions) override;
  int64_t prepare_forwards(int64_t rows, int64_t positions) override;
  void forward(const BatchSegment* segments, size_t count, float* logits, float* hidden) override;
  void prompt_draft_logits(const int32_t* tokens, int64_t T, const float* hidden, float* logits) override;
  // Bytes of the checkpoint's safetensors files this model mapped.
  size_t checkpoint_bytes() const override;
  // Bytes of weights a single-token target forward reads (all layers, active experts only, lm_head).
  size_t weight_bytes_total() const override;
  // Bytes of weights the last target forward read: as weight_bytes_total(), with the routed experts its
  // rows actually used (each used expert counts once, however many rows chose it). With MoE, k+1
  // independently routed rows touch up to k+1 times the experts of one: the floor under a verify step.
  size_t last_forward_weight_bytes() const override;
  uint64_t one_off_forwards() const override;
  // Target: per layer its key plane (kv_lora + rope) and, with its own indexer, its index plane; drafting adds
  // one key and one index plane per MTP layer (fp32).
  int64_t kv_bytes_per_position(bool drafting) const override;
  int64_t memory_bytes_for(int64_t sequences, int64_t capacity, int64_t page_tokens) const override;

  // Caches for `capacity` positions, at most the model's context (max_position_embeddings), each over a
  // pool of its own (the shared pool is for new_sequence). Their bytes are computed with overflow checks
  // and must fit in this machine's memory, else nextn::Error says how much they need.
  KVCache new_cache(int64_t capacity) const;        // target layers
  KVCache new_draft_cache(int64_t capacity) const;  // one MTP layer (each draft layer has its own)
  // A draft-layer cache from the shared MTP pool (the draft session's; reserved like new_sequence's).
  KVCache new_shared_draft_cache(int64_t capacity);

  // Runs tokens[0..S) at positions cache.length().. and appends them to the cache.
  // hidden_out: [S, H] final hidden states (after HC head + norm), may be null.
  // logits_out: [S, V] if all_logits, else [1, V] for the last token; may be null.
  void forward(const int32_t* tokens, int64_t S, KVCache& cache, float* logits_out, float* hidden_out,
               bool all_logits = true);
  // The rows of many sequences in one forward (see Model::forward).
  void forward(const CacheSegment* segments, size_t count, float* logits_out, float* hidden_out);

  // MTP draft layer `layer` over positions pos0..pos0+S-1, appended to that layer's cache `dcache`:
  // row s gets token tokens[s] (the token *after* that position) and the previous hidden state h_prev[s]
  // ([S, H]); the embedding is zeroed at absolute position 0, as the seed does.
  // forced: rows forced->first_row.. attend to these slots instead of the layer's indexer's choice (draft
  // steps >= 1); rows before it must extend the layer's chain (pos0 = the next canonical position).
  // last_topk_positions: receives the absolute positions the last row attended to (step 0's top-k).
  // hidden_out [S, H] (after final_layernorm), logits_out [S, V] (may be null).
  void draft_forward(int layer, const int32_t* tokens, const float* h_prev, int64_t S, int64_t pos0,
                     KVCache& dcache, float* logits_out, float* hidden_out, const TopkOverride* forced = nullptr,
                     std::vector<int32_t>* last_topk_positions = nullptr);

  // logits [rows, V] = lm_head(hidden [rows, H]).
  void lm_head(const float* hidden, int64_t rows, float* logits);

  // ---- what ChainedDraftSession needs (models/common/chained_drafter.h)
  int64_t draft_width() const { return cfg_.hidden_size; }
  int64_t draft_selection_max() const { return cfg_.index_topk; }
  void check_draft_request(const DraftRequest& r) const;
  // draft_forward for the requests of many sequences (one MTP layer), in one forward.
  void draft_forward_batch(int layer, DraftRequest* const* requests, size_t count);
  void draft_logits_rows(const float* hidden, int64_t rows, float* logits, int32_t* argmax, int64_t argmax_rows) {
    blocks_->lm_head_rows(draft_head_.for_drafts(w_.lm_head), hidden, rows, logits, argmax, argmax_rows);
  }
  std::string use_draft_head(DraftHeadKind kind) override;
  void run_draft_rounds(DraftRound* const* rounds, size_t n) override { draft_driver_.run(*this, rounds, n); }

 private:
  void init_facts();  // facts_ from cfg_ and w_ (at the end of loading)
  std::vector<int64_t> target_plane_widths(std::vector<LayerPlanes>* layers) const;
  std::vector<int64_t> draft_plane_widths() const;
  // Bytes the caches of a sequence of `capacity` positions take (target, and all MTP layers').
  int64_t sequence_bytes(int64_t capacity, bool drafting) const;
  void require_cache_fits(int64_t capacity, bool target, const char* what) const;
  int64_t own_pool_page(int64_t capacity) const;
  void ensure_pools();
  // The target forward's blocks and weights: this rank's shard's when tensor parallel, else the whole model's.
  HYV4Blocks& target_blocks();
  const HYV4Weights& target_weights() const;

  std::string dir_;
  HYV4Config cfg_;
  ModelFacts facts_;
  WeightStore store_;
  HYV4Weights w_;
  // The backend that computes the blocks (only the CPU's so far), and the spans of the current forward.
  std::unique_ptr<HYV4CpuBlocks> cpu_blocks_;
  std::unique_ptr<HYV4Blocks> device_blocks_;  // the CUDA backend's, when use_device(kCuda)
  HYV4Blocks* blocks_ = nullptr;
  std::unique_ptr<HYV4Shard> shard_;             // tensor parallel: this rank's part of the target
  std::unique_ptr<HYV4CpuBlocks> shard_blocks_;  // ... and the blocks that compute over it
  Communicator* tp_comm_ = nullptr;                // ... the group's host communicator
  // A tensor-parallel rank on a GPU: the shard's CUDA blocks, their collectives, and (rank 0) the MTP layers'
  // CUDA blocks over the whole weights in device_blocks_.
  std::unique_ptr<HYV4CudaBlocks> shard_device_blocks_;
  std::unique_ptr<cuda::DeviceCommunicator> device_comm_;
  void use_device_as_rank(Device device);
  Device device_ = Device::kCpu;
  std::vector<HYV4RowSpan> spans_;
  ChainedDraftDriver<HYV4Model> draft_driver_;
  std::vector<CacheSegment> batch_segments_;
  MemoryOptions memory_;
  DraftHead draft_head_;  // the draft steps' lm_head (use_draft_head)
  std::shared_ptr<KVPool> target_pool_, draft_pool_;  // shared by new_sequence / draft sessions
  size_t last_routed_bytes_ = 0;  // routed expert weights the last complete target forward read
  // Weights a target forward reads apart from its routed experts, plus routed_bytes of those.
  size_t weight_bytes_with(size_t routed_bytes) const;
};

// transformers' hub -> internal renames for hy_v4 (conversion_mapping.py), applied in the same order.
std::string hy_v4_canonical_name(const std::string& checkpoint_name);

}  // namespace nextn
