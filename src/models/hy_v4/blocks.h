// The blocks an HY V4 forward is built from, as a backend computes them (P11's seam, docs/backend.md).
//
// model.cpp says what runs in which order (the builder: embed, per layer iHC pre -> norm -> sparse MLA ->
// iHC post -> iHC pre -> norm -> MLP/MoE -> iHC post, HC head, final norm, lm_head; the MTP layers' plain
// pre-norm blocks); a backend owns where the activations live, the threads, the kernels and the
// workspace: `backend/cpu/hy_v4_blocks.cpp` for the CPU (the thread pool's scheduling lives there, not in
// the model), a CUDA one next. Activations are named, never pointers: on a GPU they live in device memory.
// Every block works on the rows of the spans given to begin() (all sequences of the forward, in order).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/kv_cache.h"
#include "models/common/mlp_bytes.h"
#include "models/common/draft_round.h"
#include "ops/ops.h"

namespace nextn {

struct HyperConnectionWeights;
struct DecoderLayerWeights;
struct FfnWeights;
struct MtpLayerWeights;
struct HYV4Weights;
struct DraftRequest;

// One segment's rows of the current forward: rows [first_row, first_row + rows) of the batch sit at cache
// slots slot0.. and absolute positions pos0..; tokens [rows].
// (MTP forwards: `forced` selections for the span's rows from forced->first_row on, and `last_topk`
// receiving the absolute positions its last row attended to.)
struct HYV4RowSpan {
  KVCache* cache;
  int64_t first_row, rows, slot0, pos0;
  const int32_t* tokens;
  bool all_logits;
  const TopkOverride* forced;
  std::vector<int32_t>* last_topk;
  int32_t* argmax;  // not null: the span's logit rows' argmax go here instead of their logits (BatchSegment)
};

// The [S, H] activations a forward names (x: a block's input before its norm, and the residual of MTP
// blocks; xn: the normed input; y: a block's output; hidden: the final hidden state).
enum class HYV4Act { kX, kXn, kY, kHidden };
// Where a block's output goes: y itself, added into x (the MTP layers' residual), or into the streams through
// the sublayer's post gates (the target's hyper-connection post: streams[s, j] += post[s, j] · output[s]). A
// backend may do the last two in the block's last kernel (CUDA: one launch and one [S, H] pass fewer each).
enum class HYV4Out { kY, kAddToX, kHyperPost };

class HYV4Blocks {
 public:
  virtual ~HYV4Blocks() = default;

  // Room for `rows` rows over caches of `positions` positions in pages of `page_tokens`, so that the decode
  // loop never allocates.
  virtual void reserve(int64_t rows, int64_t positions, int64_t page_tokens) = 0;
  // The rows of the coming forward (the target's or an MTP layer's): its spans, in row order (first_row
  // ascending and contiguous).
  virtual void begin(const HYV4RowSpan* spans, size_t count) = 0;

  // Target forward. streams [S, C, H] = C copies of embed(tokens).
  virtual void embed_streams(const Linear& embed) = 0;
  // streams -> x [S, H] (weighted by the pre gates) -> xn = rms_norm(x) · norm, and the sublayer's post gates
  // [S, C] (for its HYV4Out::kHyperPost).
  virtual void hyper_pre(const HyperConnectionWeights& hc, const std::vector<float>& norm) = 0;
  // streams -> x [S, H] with the head's sigmoid gates -> hidden = rms_norm(x) · norm.
  virtual void hc_head(const Linear& fn, const std::vector<float>& base, const std::vector<float>& scale,
                       const std::vector<float>& norm) = 0;

  // MTP layer input: x [S, H] = eh_proj(concat(enorm(embed(token)), hnorm(h_prev))) of every request's rows,
  // in order (the embedding zeroed at absolute position 0).
  virtual void mtp_input(const MtpLayerWeights& m, const Linear& embed, DraftRequest* const* requests,
                         size_t count) = 0;

  virtual void rms_norm(HYV4Act in, const std::vector<float>& weight, HYV4Act out) = 0;
  // xn -> out: sparse MLA with its DSA indexer (or the forced selections), rows written to cache layer `layer`
  // at their slots; spans with last_topk receive their last row's selection.
  virtual void attention(const DecoderLayerWeights& L, size_t layer, HYV4Out out) = 0;
  // xn -> out: dense SwiGLU MLP or MoE. Returns the bytes of routed expert weights it read.
  virtual size_t ffn(const FfnWeights& F, HYV4Out out) = 0;

  // Every block of the forward has been called; what follows reads its results (a backend that records
  // forwards, the CUDA one, closes or replays the recording here).
  virtual void finish() {}
  // Forwards so far that did one-off work a later forward of the same shape will not (CUDA: a shape's first,
  // eager run and its graph's recording): their time is no measure of speed.
  virtual uint64_t one_off_forwards() const { return 0; }

  // hidden rows [first, first + rows) -> out [rows, H] (host memory).
  virtual void read_hidden(int64_t first, int64_t rows, float* out) = 0;
  // logits of the rows that want them (every row of an all_logits span, else its last), in row order:
  // out [n, V] (host memory), lm_head's weights read once for all. A span with `argmax` gets its rows' argmax
  // there (finite_argmax: -1 for a row with a NaN or inf), and its rows of out may be left unwritten.
  virtual void logits(const Linear& lm_head, float* out) = 0;
  // logits [rows, V] = lm_head(hidden [rows, H]) for rows given in host memory (the drafter's); the first
  // argmax_rows rows' finite_argmax go to argmax [argmax_rows] instead (their rows of out may stay unwritten).
  virtual void lm_head_rows(const Linear& lm_head, const float* hidden, int64_t rows, float* out, int32_t* argmax,
                            int64_t argmax_rows) = 0;
  // A weight made after the blocks (the drafts' FP8 head) that they must be able to read (CUDA: uploads it).
  virtual void hold(const Linear& w) { (void)w; }
};

}  // namespace nextn
