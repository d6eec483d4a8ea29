#include "models/common/draft_head.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"

namespace nextn {
namespace {

// A bf16 [V, H] head of normal values, some rows scaled up (so block scales differ), with a tile of zeros.
struct Bf16Head {
  std::vector<uint16_t> bits;
  Linear lin;
  Bf16Head(int64_t V, int64_t H) : bits(size_t(V * H)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 0.05f);
    for (int64_t r = 0; r < V; ++r)
      for (int64_t c = 0; c < H; ++c) {
        const bool zero_tile = r < DraftHead::kBlock && c >= DraftHead::kBlock && c < 2 * DraftHead::kBlock;
        bits[size_t(r * H + c)] = f32_to_bf16(zero_tile ? 0.0f : n(rng) * (r % 7 == 0 ? 40.0f : 1.0f));
      }
    lin.dtype = DType::BF16;
    lin.out = V;
    lin.in = H;
    lin.data = bits.data();
    lin.row_stride = H;
  }
};

// Every element of the copy is the nearest e4m3 code of w / s times s, s = max |w| / 448 over its 128 x 128
// tile: checked against the scalar definition for a head whose sizes are not multiples of 128 (partial tiles
// at the bottom and the right), quantized on 1 and on 3 threads (the same bytes).
TEST(DraftHead, Fp8CopyIsTheNearestCodeOfEachTileScaledByItsMaximum) {
  const int64_t V = 300, H = 200, B = DraftHead::kBlock;
  const Bf16Head head(V, H);
  DraftHead one;
  one.build(head.lin, DraftHeadKind::kFp8, nullptr);
  ASSERT_TRUE(one.is_copy());
  const Linear& q = one.for_drafts(head.lin);
  EXPECT_EQ(q.dtype, DType::F8_E4M3);
  EXPECT_EQ(q.out, V);
  EXPECT_EQ(q.in, H);
  EXPECT_EQ(q.block_out, B);
  EXPECT_EQ(q.scale_cols, 2);
  EXPECT_EQ(one.copy_bytes(), V * H + 3 * 2 * int64_t(sizeof(float)));
  const auto* codes = static_cast<const uint8_t*>(q.data);
  const auto* scales = static_cast<const float*>(q.scale);
  for (int64_t br = 0; br < 3; ++br)
    for (int64_t bc = 0; bc < 2; ++bc) {
      float amax = 0.0f;
      for (int64_t r = br * B; r < std::min(V, (br + 1) * B); ++r)
        for (int64_t c = bc * B; c < std::min(H, (bc + 1) * B); ++c)
          amax = std::max(amax, std::fabs(bf16_to_f32(head.bits[size_t(r * H + c)])));
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      ASSERT_EQ(scales[br * 2 + bc], s) << "tile " << br << "," << bc;
      for (int64_t r = br * B; r < std::min(V, (br + 1) * B); ++r)
        for (int64_t c = bc * B; c < std::min(H, (bc + 1) * B); ++c) {
          const float w = bf16_to_f32(head.bits[size_t(r * H + c)]);
          ASSERT_EQ(codes[r * H + c], f32_to_fp8_e4m3(w / s)) << "row " << r << " col " << c;
          // (and within half an e4m3 step of w, 2^-4 relative for normal codes, 2^-10 · s for subnormal ones, up
          // to the roundings of w / s and of the product)
          const float back = fp8_e4m3_to_f32(codes[r * H + c]) * s;
          ASSERT_LE(std::fabs(back - w), 1.001f * std::max(std::fabs(w) * 0.0625f, s * 0x1p-10f)) << r << "," << c;
        }
    }
  EXPECT_EQ(scales[0 * 2 + 1], 1.0f);  // the tile of zeros
  ThreadPool pool(3);
  DraftHead three;
  three.build(head.lin, DraftHeadKind::kFp8, &pool);
  const Linear& q3 = three.for_drafts(head.lin);
  EXPECT_EQ(std::memcmp(q3.data, q.data, size_t(V * H)), 0);
  EXPECT_EQ(std::memcmp(q3.scale, q.scale, 6 * sizeof(float)), 0);
  EXPECT_NE(one.describe(head.lin).find("lm_head (BF16) for the target, an FP8 copy"), std::string::npos)
      << one.describe(head.lin);
}

// No copy where it would not pay or was not asked for: the target's own head is the drafts'.
TEST(DraftHead, TargetKindFp8HeadsAndSmallHeadsUseTheTargetsOwnHead) {
  const Bf16Head head(64, 64);
  DraftHead d;
  d.build(head.lin, DraftHeadKind::kTarget, nullptr);
  EXPECT_FALSE(d.is_copy());
  EXPECT_EQ(&d.for_drafts(head.lin), &head.lin);
  EXPECT_EQ(d.describe(head.lin), "lm_head (BF16) for the target and the drafts");
  std::vector<uint8_t> codes(64 * 64, 0x38);
  std::vector<float> scales(1, 0.5f);
  Linear fp8;
  fp8.dtype = DType::F8_E4M3;
  fp8.out = fp8.in = fp8.row_stride = 64;
  fp8.data = codes.data();
  fp8.scale = scales.data();
  fp8.scale_cols = 1;
  d.build(fp8, DraftHeadKind::kFp8, nullptr);
  EXPECT_FALSE(d.is_copy());
  EXPECT_EQ(&d.for_drafts(fp8), &fp8);
  d.build(head.lin, DraftHeadKind::kFp8, nullptr);  // (a later build replaces the earlier)
  EXPECT_TRUE(d.is_copy());
  d.build(head.lin, DraftHeadKind::kTarget, nullptr);
  EXPECT_FALSE(d.is_copy());
  EXPECT_EQ(d.copy_bytes(), 0);
  // auto: a copy only from auto_min_bytes (the head here: 64 x 64 bf16, 8 KiB) up
  d.build(head.lin, DraftHeadKind::kAuto, nullptr);
  EXPECT_FALSE(d.is_copy());
  d.build(head.lin, DraftHeadKind::kAuto, nullptr, 8192);
  EXPECT_TRUE(d.is_copy());
  d.build(head.lin, DraftHeadKind::kAuto, nullptr, 8193);
  EXPECT_FALSE(d.is_copy());
}

TEST(DraftHead, ParsesItsNamesAndSaysWhatIsWrong) {
  EXPECT_EQ(parse_draft_head("fp8", "--draft-head"), DraftHeadKind::kFp8);
  EXPECT_EQ(parse_draft_head("target", "--draft-head"), DraftHeadKind::kTarget);
  EXPECT_EQ(parse_draft_head("auto", "--draft-head"), DraftHeadKind::kAuto);
  EXPECT_STREQ(draft_head_name(DraftHeadKind::kAuto), "auto");
  EXPECT_STREQ(draft_head_name(DraftHeadKind::kFp8), "fp8");
  EXPECT_STREQ(draft_head_name(DraftHeadKind::kTarget), "target");
  try {
    parse_draft_head("int4", "--draft-head");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--draft-head must be auto, fp8 or target, got 'int4'");
  }
}

}  // namespace
}  // namespace nextn
