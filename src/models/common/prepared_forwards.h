// Model::prepare_forwards for the families whose CUDA backends record forwards by shape (forward_graphs.h): the
// shapes a batch of up to `rows` rows runs, walked once each so that the backend records them before the first
// request. The family supplies its forwards over scratch memory of its own; this walks the shapes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "models/common/chained_drafter.h"
#include "models/common/draft_round.h"
#include "models/common/forward_graphs.h"
#include "models/model.h"

namespace nextn {

// The padded row counts prepare_forwards records (largest last): those of 1..rows rows, as many as fit in the
// graphs a backend keeps beside room for the shapes of prompts, given forwards_per_count shapes per count.
inline std::vector<int64_t> prepared_row_counts(int64_t rows, int64_t forwards_per_count) {
  constexpr int64_t kRoomForPrompts = 64;
  std::vector<int64_t> counts = padded_row_counts(rows);
  const int64_t fit = (int64_t(ForwardGraphs::kMaxGraphs) - kRoomForPrompts) / std::max<int64_t>(forwards_per_count, 1);
  if (int64_t(counts.size()) > fit) counts.resize(size_t(std::max<int64_t>(fit, 0)));
  return counts;
}

// The rows a family reserves before walking counts up to S_max: those, and what a draft session reserves too
// whatever its k (MemoryOptions::max_verify_rows bounds it): a workspace that grows later forgets the graphs.
inline int64_t prepared_reservation_rows(int64_t S_max, const MemoryOptions& memory) {
  const int k_most = int(std::max<int64_t>(memory.max_verify_rows - 1, 1));
  return std::max(S_max, chained_draft::backlog_rows(k_most));
}

// For each count, largest first, twice (a shape's first run is eager, its second recorded): target(S), then for
// each MTP layer draft(layer, S, forced) in its three kinds: no forced selection (a catch-up), rows after the
// first forced (a catch-up with the first draft step merged in), all forced (draft steps). The forced rows
// attend to slot 0 of the layer's scratch cache, which the family must have written first. Returns the shapes
// walked.
template <class Target, class Draft>
int64_t walk_forward_shapes(const std::vector<int64_t>& counts, int mtp_layers, Target&& target, Draft&& draft) {
  const int32_t slot0 = 0;
  int64_t shapes = 0;
  for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
    const int64_t S = *it;
    for (int run = 0; run < 2; ++run) target(S);
    for (int layer = 0; layer < mtp_layers; ++layer)
      for (const int64_t first_forced : {int64_t(-1), int64_t(1), int64_t(0)}) {
        const TopkOverride forced{&slot0, 1, first_forced};
        for (int run = 0; run < 2; ++run) draft(layer, S, first_forced < 0 ? nullptr : &forced);
      }
    shapes += 1 + 3 * mtp_layers;
  }
  return shapes;
}

}  // namespace nextn
