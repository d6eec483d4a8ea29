// The rows of a batched forward and the spans (one per sequence's segment) they belong to.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace nextn {

// spans: first_row ascending and contiguous from 0 (each with first_row and rows). Fills row_span [S] with
// each row's span index and returns S, the forward's rows.
template <class Span>
int64_t map_rows_to_spans(const std::vector<Span>& spans, std::vector<int32_t>& row_span) {
  int64_t S = 0;
  for (const Span& sp : spans) {
    if (sp.first_row != S) throw Error("internal: forward spans out of row order");
    S += sp.rows;
  }
  row_span.resize(static_cast<size_t>(S));
  for (size_t i = 0; i < spans.size(); ++i)
    for (int64_t r = 0; r < spans[i].rows; ++r) row_span[static_cast<size_t>(spans[i].first_row + r)] = static_cast<int32_t>(i);
  return S;
}

}  // namespace nextn
