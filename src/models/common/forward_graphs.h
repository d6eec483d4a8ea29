// A CUDA backend's forwards as CUDA graphs, by shape (both families' cuda_blocks): a shape's second forward is
// recorded, later ones replay it, so that a decode step is one launch instead of hundreds. A shape is what
// changes a kernel's arguments: the rows (padding included), which forward (the target's or an MTP layer's)
// and the forced-selection mode; the kernels read positions, slots, spans, page tables and tokens from
// per-forward uploads at addresses set by the rows alone, so one graph serves every forward of its shape.
#pragma once
#include <cstdint>
#include <map>
#include <tuple>

#include "ops/cuda/cuda_ops.h"

namespace nextn {

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
  void forget();   // the graphs hold addresses that changed (a grown workspace)
  uint64_t one_offs() const { return one_offs_; }  // forwards that ran eagerly or recorded

 private:
  static constexpr size_t kMaxGraphs = 256;
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
