// How tensor-parallel ranks split a dimension (heads, intermediate features, experts, vocabulary rows):
// contiguous ranges in rank order, as even as the alignment allows (docs/parallel.md).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ops/ops.h"

namespace nextn {

struct UnitRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// `units` units (each `unit_cols` columns of the row-parallel matrix they feed) over `ranks` ranks, every
// boundary at a multiple of `align` columns (an FP8 matrix's scale block: a column slice must start one;
// 1: any). Units go in groups of the fewest whose columns are a multiple of align, the groups as evenly as
// possible, a remainder to the later ranks (rank 0 also runs the MTP layers): a rank may get none (e.g. 4 heads
// of 32 columns over 2 ranks with 128-column blocks: all on rank 1).
inline std::vector<UnitRange> split_units(int64_t units, int64_t unit_cols, int64_t align, int ranks) {
  const int64_t cols = unit_cols > 0 ? unit_cols : 1, a = align > 0 ? align : 1;
  const int64_t group = a / std::gcd(cols, a);  // units per aligned group
  const int64_t groups = (units + group - 1) / group;
  std::vector<UnitRange> out;
  for (int r = 0; r < ranks; ++r) {
    const int64_t g0 = groups * r / ranks, g1 = groups * (r + 1) / ranks;
    out.push_back({std::min(units, g0 * group), std::min(units, g1 * group)});
  }
  return out;
}

// The widest of the ranks' ranges (what a buffer for any rank's part needs).
inline int64_t widest(const std::vector<UnitRange>& ranges) {
  int64_t width = 0;
  for (const UnitRange& r : ranges) width = std::max(width, r.size());
  return width;
}

// The experts a rank holds, given their weights with the others' empty (out = 0): all of them on one rank,
// else its range. Returns false when the held ones are not one contiguous range (no split makes that).
inline bool held_units(const std::vector<Linear>& weights, UnitRange* held) {
  const int64_t n = int64_t(weights.size());
  int64_t e0 = 0;
  while (e0 < n && weights[size_t(e0)].out == 0) ++e0;
  int64_t e1 = e0;
  while (e1 < n && weights[size_t(e1)].out > 0) ++e1;
  for (int64_t e = e1; e < n; ++e)
    if (weights[size_t(e)].out > 0) return false;
  *held = {e0, e1};
  return true;
}

// The columns a row-parallel slice of w may start at: an FP8 weight's scale block, else any.
inline int64_t column_align(const Linear& w) { return w.dtype == DType::F8_E4M3 ? w.block_in : 1; }

// A SwiGLU MLP's part on `rank` (dense MLPs, shared experts): gate / up rows and down columns of its
// intermediate features, split on down's scale blocks; all three empty (out = 0) on a rank that gets none.
// down's bias, if any, stays on rank 0 (added once).
inline void shard_swiglu(Linear& gate, Linear& up, Linear& down, int rank, int ranks) {
  const UnitRange f = split_units(down.in, 1, column_align(down), ranks)[size_t(rank)];
  if (f.size() == 0) {
    gate = up = down = Linear{};
    return;
  }
  const float* bias = down.bias;
  gate = gate.rows(f.begin, f.size());
  up = up.rows(f.begin, f.size());
  down = down.columns(f.begin, f.size());
  if (rank == 0) down.bias = bias;
}

}  // namespace nextn
