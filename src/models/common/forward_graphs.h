// A CUDA backend's forwards as CUDA graphs, by shape (both families' cuda_blocks): a shape's second forward is
// recorded, later ones replay it, so that a decode step is one launch instead of hundreds. A shape is what
// changes a kernel's arguments: the rows (padding included), which forward (the target's or an MTP layer's)
// and the forced-selection mode; the kernels read positions, slots, spans, page tables and tokens from
// per-forward uploads at addresses set by the rows alone, so one graph serves every forward of its shape.
#pragma once
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "ops/cuda/cuda_ops.h"

namespace nextn {

// The rows a forward of S rows runs as, so that few shapes recur: up to 8, one of 1, 2, 3, 4, 6, 8 (a single
// sequence's verify of k + 1 <= 4 rows keeps its size: its shape recurs anyway, and each padding row costs it a
// few percent); past 8, S rounded up to a quarter of its power of two (at least 8): 64..128 rows (64 sequences
// at k = 1) take 5 sizes instead of 65. Padding costs a few rows of work; a forward whose shape has no graph
// costs its launches (on the bundled models at 32-64 sequences, most MTP forwards ran eagerly, and a k = 1 step
// cost twice a plain one; the target's verify forwards too, while the sequences of a batch finished one by
// one, and the small batches they leave met every S below 8 in every kind of forward). Forwards past
// kPadFormsUpTo rows (a long prompt) are not padded.
constexpr int64_t kPadFormsUpTo = 2048;
constexpr int64_t kMaxPaddingRows = kPadFormsUpTo / 4;  // (the most padded_forward_rows adds)
int64_t padded_forward_rows(int64_t S);
// The row counts forwards of 1..rows rows run as (padded_forward_rows), ascending.
std::vector<int64_t> padded_row_counts(int64_t rows);

// NEXTN_CUDA_GRAPH_LOG=1 prints each forward that does one-off work (its shape: rows, which forward, forced
// mode) and each time the graphs are forgotten, with why, to stderr: what to look at when steps stay slow.
class ForwardGraphs {
 public:
  using Key = std::tuple<int64_t, uintptr_t, int>;

  // At a forward's first block: true when its shape's graph will run at finish() (the blocks then queue
  // nothing: skipping()); false when the forward runs its kernels, recorded if its shape recurs.
  bool replay_or_record(const Key& key);
  bool skipping() const { return mode_ == Mode::kReplaying; }
  // After a forward's last block: ends a recording and launches it, or launches the replayed graph.
  void finish();
  void abandon();  // at a forward's start: a recording left open by a forward that threw is dropped
  void forget(const char* why);  // the graphs hold addresses that changed (a grown workspace)
  uint64_t one_offs() const { return one_offs_; }  // forwards that ran eagerly or recorded
  static constexpr size_t kMaxGraphs = 256;  // graphs kept (the least recently replayed goes first)

 private:
  enum class Mode { kEager, kRecording, kReplaying };
  void keep(cuda::Graph graph);  // under key_, evicting the least recently replayed when full
  struct Recorded {
    cuda::Graph graph;
    uint64_t used = 0;  // uses_ at its last replay (or recording)
  };
  Mode mode_ = Mode::kEager;
  Key key_{};
  std::map<Key, Recorded> graphs_;
  std::map<Key, int> seen_;
  uint64_t uses_ = 0, one_offs_ = 0;
};

}  // namespace nextn
