// padded_forward_rows (forward_graphs.h): the row counts the CUDA backends' forwards run as.
#include "models/common/forward_graphs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace nextn {
namespace {

TEST(PaddedForwardRows, NeverFewerRowsAndAtMostTheScratchPlanesRowsMore) {
  for (int64_t S = 1; S <= kPadFormsUpTo + 100; ++S) {
    const int64_t P = padded_forward_rows(S);
    ASSERT_GE(P, S) << S;
    ASSERT_LE(P - S, kMaxPaddingRows) << S << " rows: the padding span must fit the scratch planes' page";
    if (S > kPadFormsUpTo) {
      ASSERT_EQ(P, S) << "a long prompt is not padded";
    }
  }
}

TEST(PaddedForwardRows, SmallForwardsKeepTheirSizeAndRowCountsTakeFewShapes) {
  for (int64_t S = 1; S <= 4; ++S) EXPECT_EQ(padded_forward_rows(S), S) << "a verify of up to 4 rows";
  EXPECT_EQ(padded_forward_rows(5), 6);
  EXPECT_EQ(padded_forward_rows(7), 8);
  std::set<int64_t> shapes;
  for (int64_t S = 65; S <= 128; ++S) shapes.insert(padded_forward_rows(S));
  EXPECT_EQ(shapes.size(), 4u) << "64 sequences at k = 1: a quarter of the power of two a step";
  for (int64_t S = 1; S < kPadFormsUpTo; ++S)
    ASSERT_LE(padded_forward_rows(S), padded_forward_rows(S + 1)) << "more rows never run as fewer";
  for (int64_t S = 1; S <= kPadFormsUpTo; ++S)
    ASSERT_EQ(padded_forward_rows(padded_forward_rows(S)), padded_forward_rows(S)) << "a padded size is its own";
}

// What prepare_forwards records: each row count a forward of 1..rows rows runs as, once, ascending.
TEST(PaddedForwardRows, PreparedCountsAreEveryShapeUpToTheBatchOnce) {
  for (int64_t rows : {int64_t(1), int64_t(4), int64_t(9), int64_t(192), kPadFormsUpTo, kPadFormsUpTo + 50}) {
    const std::vector<int64_t> counts = padded_row_counts(rows);
    std::set<int64_t> expected;
    for (int64_t S = 1; S <= std::min(rows, kPadFormsUpTo); ++S) expected.insert(padded_forward_rows(S));
    EXPECT_EQ(std::set<int64_t>(counts.begin(), counts.end()), expected) << rows << " rows";
    EXPECT_EQ(counts.size(), expected.size()) << rows << " rows: each count once";
    EXPECT_TRUE(std::is_sorted(counts.begin(), counts.end())) << rows << " rows";
  }
  EXPECT_EQ(padded_row_counts(192).size(), 19u) << "64 sequences at k = 1 (1, 2, 3, 4, 6, 8, 16, 24, ..., 64, 80, ... 192)";
  EXPECT_TRUE(padded_row_counts(0).empty());
}

}  // namespace
}  // namespace nextn
