// The blocks a Qwen4-Exp forward is built from, as a backend computes them (P11's seam, docs/backend.md).
//
// model.cpp says what runs in which order (embed into the C streams; per layer the PLE n-gram add, a
// GatedResidual mix into x, Gated DeltaNet or QSA, the injection back into the streams, a second mix, MoE,
// injection; the final mixer and lm_head; the MTP layers' input); a backend owns where the activations
// live, the threads, the kernels and the workspace: `cpu_blocks.cpp` for the CPU. The activations are the
// backend's (streams X [S, C·H], x and y [S, H], the injection gates [S, C]); only tokens, the hidden
// streams asked for and the logits cross to the host. Every block works on the rows of the spans given to
// begin() (all sequences of the forward, in order).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/kv_cache.h"
#include "models/common/draft_round.h"
#include "models/qwen4_exp/config.h"
#include "ops/ops.h"

namespace nextn {

class Qwen4ExpSequence;
struct GatedResidualWeights;
struct GdnWeights;
struct QsaWeights;
struct MoeWeights;
struct PleWeights;
struct Qwen4MtpWeights;
struct DraftRequest;

// The most slots one QSA row attends to, as both backends size it: the budget's blocks, the incomplete block's
// tail, and the draft rows a forced (reused) selection adds after step 0's query (the rest of one round).
constexpr int64_t kMaxDraftExtension = 64;
inline int64_t qsa_selection_cap(const Qwen4ExpConfig& c) {
  return c.indexer_budget + (c.indexer_compress_ratio > 1 ? c.indexer_compress_ratio : 1) + kMaxDraftExtension;
}

// One segment's rows in the current forward: rows [first_row, first_row + rows) of the batch at cache slots
// slot0.. and positions pos0..
struct Qwen4RowSpan {
  Qwen4ExpSequence* seq;  // its recurrent state (null in MTP forwards)
  KVCache* cache;         // its QSA pages (null when the model has no QSA layer)
  int64_t first_row, rows, slot0, pos0;
  const int32_t* tokens;
  bool all_logits;
  // MTP forwards: a forced selection for rows forced->first_row.. of the span, and where its last row's
  // selected positions go
  const TopkOverride* forced;
  std::vector<int32_t>* last_topk;
  int32_t* argmax;  // not null: the span's logit rows' argmax go here instead of their logits (BatchSegment)
};

// Where each layer's recurrent state sits in one of a sequence's state slots, and how many slots it keeps.
struct Qwen4StateLayout {
  std::vector<int64_t> state_off;  // per layer: its conv window, then its GDN states (-1: none)
  std::vector<int64_t> ple_off;    // per layer: its PLE conv window (-1: none)
  int64_t slots = 9;               // MemoryOptions::max_verify_rows
};

class Qwen4ExpBlocks {
 public:
  virtual ~Qwen4ExpBlocks() = default;

  // Room for `rows` rows over caches of `positions` positions, so that the decode loop never allocates.
  virtual void reserve(int64_t rows, int64_t positions, int64_t page_tokens) = 0;
  virtual void begin(const Qwen4RowSpan* spans, size_t count) = 0;  // first_row ascending and contiguous

  virtual void embed_streams(const Linear& embed) = 0;  // X [S, C·H] = C copies of embed(tokens)
  // X += the layer's PLE n-gram embeddings (its conv windows in the sequences' state slots).
  virtual void ple_add(const PleWeights& p, int layer) = 0;
  // X -> x [S, H], and with `inject` the injection gates [S, C].
  virtual void gated_residual(const GatedResidualWeights& g, bool inject) = 0;
  virtual void gdn(const GdnWeights& g, int layer) = 0;               // x -> y, state slots updated
  virtual void qsa(const QsaWeights& a, size_t cache_layer) = 0;      // x -> y, KV written
  virtual size_t moe(const MoeWeights& m) = 0;  // x -> y; returns the routed expert weight bytes it read
  virtual void inject() = 0;                    // X[:, c] += inj[c] · y
  // MTP input: X = fc_hidden(norm(h_prev)) per stream + fc_embedding(norm(embed(token))), every request's rows.
  virtual void mtp_input(const Qwen4MtpWeights& m, const Linear& embed, DraftRequest* const* requests,
                         size_t count) = 0;

  // After a forward's last layer, before anything is read back (a backend that queued the forward, or replays
  // it as a recorded graph, runs it now).
  virtual void finish() {}
  virtual uint64_t one_off_forwards() const { return 0; }  // Model::one_off_forwards

  virtual void read_streams(int64_t first, int64_t rows, float* out) = 0;  // X rows -> out [rows, C·H]
  // Logits of the rows that want them (every row of an all_logits span, else its last), through `mixer` and
  // one lm_head: out [n, V]. X is spent. A span with `argmax` gets its rows' argmax there (finite_argmax: -1
  // for a row with a NaN or inf), and its rows of out may be left unwritten.
  virtual void logits(const GatedResidualWeights& mixer, const Linear& lm_head, float* out) = 0;
  // The same for streams given in host memory ([rows, C·H], the drafter's); the first argmax_rows rows'
  // finite_argmax go to argmax [argmax_rows] instead (their rows of out may stay unwritten).
  virtual void logits_of(const GatedResidualWeights& mixer, const Linear& lm_head, const float* streams,
                         int64_t rows, float* out, int32_t* argmax, int64_t argmax_rows) = 0;
  // A weight made after the blocks (the drafts' FP8 head) that they must be able to read (CUDA: uploads it).
  virtual void hold(const Linear& w) { (void)w; }
};

}  // namespace nextn
