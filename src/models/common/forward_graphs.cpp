// ForwardGraphs (forward_graphs.h).
#include "models/common/forward_graphs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace nextn {

int64_t padded_forward_rows(int64_t S) {
  if (S > kPadFormsUpTo) return S;
  if (S <= 8) return S <= 4 ? S : S <= 6 ? 6 : 8;
  int64_t pow2 = 8;
  while (pow2 * 2 <= S) pow2 *= 2;
  const int64_t step = std::max<int64_t>(8, pow2 / 4);
  return (S + step - 1) / step * step;
}

namespace {
bool graph_log() {
  static const bool on = [] {
    const char* e = std::getenv("NEXTN_CUDA_GRAPH_LOG");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}
}  // namespace

std::vector<int64_t> padded_row_counts(int64_t rows) {
  std::vector<int64_t> counts;
  rows = std::min(rows, kPadFormsUpTo);
  for (int64_t S = 1; S <= rows; S = padded_forward_rows(S) + 1) counts.push_back(padded_forward_rows(S));
  return counts;
}

bool ForwardGraphs::replay_or_record(const Key& key) {
  key_ = key;
  if (auto it = graphs_.find(key_); it != graphs_.end()) {
    it->second.used = ++uses_;
    mode_ = Mode::kReplaying;
    return true;
  }
  constexpr size_t kMaxSeen = 1 << 14;  // (shapes seen once: forgotten wholesale rather than kept forever)
  if (seen_.size() >= kMaxSeen) seen_.clear();
  const int seen = ++seen_[key_];
  // A shape is recorded at its second run while there is room, and once kMaxGraphs are kept only at its
  // kFrequent-th, evicting the least recently replayed graph: recording (capture and instantiation) costs more
  // than an eager run of these small forwards, and the MTP forwards' row counts vary with each round's
  // acceptance, so recording every shape that recurs once churned (at 32-64 sequences, 7% slower than a hard
  // cap), while a hard cap left shapes that came after it eager for good (the bench's 64-sequence verify).
  constexpr int kFrequent = 16;
  const bool full = graphs_.size() >= kMaxGraphs;
  one_offs_ += !full || seen == kFrequent;  // (once full, the eager runs before a recording are the steady state)
  const bool record = seen == (full ? kFrequent : 2);
  if (graph_log() && (!full || record))
    std::fprintf(stderr, "nextn: forward graph %s: %lld rows, forward %#llx, forced mode %d (%zu kept)\n",
                 record ? "recorded" : "run eagerly", static_cast<long long>(std::get<0>(key_)),
                 static_cast<unsigned long long>(std::get<1>(key_)), std::get<2>(key_), graphs_.size());
  if (record) {
    cuda::begin_capture();
    mode_ = Mode::kRecording;
  }
  return false;
}

void ForwardGraphs::keep(cuda::Graph graph) {
  if (graphs_.size() >= kMaxGraphs) {
    auto oldest = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
      if (it->second.used < oldest->second.used) oldest = it;
    graphs_.erase(oldest);
  }
  graphs_[key_] = Recorded{std::move(graph), ++uses_};
}

void ForwardGraphs::finish() {
  if (mode_ == Mode::kRecording) {
    mode_ = Mode::kEager;
    keep(cuda::end_capture());
    graphs_.at(key_).graph.launch();
  } else if (mode_ == Mode::kReplaying) {
    mode_ = Mode::kEager;
    graphs_.at(key_).graph.launch();
  }
}

void ForwardGraphs::abandon() {
  if (mode_ == Mode::kRecording) cuda::abandon_capture();
  mode_ = Mode::kEager;
}

void ForwardGraphs::forget(const char* why) {
  if (graph_log() && !graphs_.empty())
    std::fprintf(stderr, "nextn: %zu forward graphs forgotten: %s\n", graphs_.size(), why);
  graphs_.clear();
  seen_.clear();
}

}  // namespace nextn
