#include "models/common/draft_head.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "models/common/quant_plan.h"

namespace nextn {

DraftHeadKind parse_draft_head(const std::string& s, const std::string& what) {
  if (s == "auto") return DraftHeadKind::kAuto;
  if (s == "target") return DraftHeadKind::kTarget;
  if (s == "fp8") return DraftHeadKind::kFp8;
  throw Error(what + " must be auto, fp8 or target, got '" + s + "'");
}

const char* draft_head_name(DraftHeadKind k) {
  switch (k) {
    case DraftHeadKind::kAuto:
      return "auto";
    case DraftHeadKind::kFp8:
      return "fp8";
    default:
      return "target";
  }
}

void quantize_fp8_block_rows(const Linear& w, int64_t block, int64_t block_row0, int64_t block_row1, uint8_t* bytes,
                             float* scales) {
  const int64_t K = w.in, cols = block_count(K, block);
  std::vector<float> rows(size_t(block * K));  // one block row, dequantized: [block, K]
  for (int64_t br = block_row0; br < block_row1; ++br) {
    const int64_t r0 = br * block, n = std::min(block, w.out - r0);
    for (int64_t r = 0; r < n; ++r) ops::dequant_row(w, r0 + r, rows.data() + r * K);
    for (int64_t bc = 0; bc < cols; ++bc) {
      const int64_t c0 = bc * block, c1 = std::min(K, c0 + block);
      float amax = 0.0f;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(rows[size_t(r * K + c)]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      scales[br * cols + bc] = scale;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = c0; c < c1; ++c)
          bytes[(r0 + r) * K + c] = f32_to_fp8_e4m3(rows[size_t(r * K + c)] / scale);
    }
  }
}

void DraftHead::build(const Linear& target, DraftHeadKind kind, ThreadPool* pool, int64_t auto_min_bytes) {
  own_ = Linear{};
  bytes_.clear();
  scales_.clear();
  if (kind == DraftHeadKind::kAuto)
    kind = int64_t(target.weight_bytes()) >= auto_min_bytes ? DraftHeadKind::kFp8 : DraftHeadKind::kTarget;
  if (kind == DraftHeadKind::kTarget || target.dtype == DType::F8_E4M3 || target.data == nullptr) return;
  const int64_t V = target.out, H = target.in, brows = block_count(V, kBlock), cols = block_count(H, kBlock);
  bytes_.resize(size_t(V * H));
  scales_.resize(size_t(brows * cols));
  auto run = [&](int64_t b0, int64_t b1, int) {
    quantize_fp8_block_rows(target, kBlock, b0, b1, bytes_.data(), scales_.data());
  };
  if (pool != nullptr)
    pool->parallel_for(brows, 1, run);
  else
    run(0, brows, 0);
  own_.dtype = DType::F8_E4M3;
  own_.out = V;
  own_.in = H;
  own_.data = bytes_.data();
  own_.row_stride = H;
  own_.scale = scales_.data();
  own_.scale_dtype = DType::F32;
  own_.block_out = kBlock;
  own_.block_in = kBlock;
  own_.scale_cols = cols;
}

std::string DraftHead::describe(const Linear& target) const {
  const std::string head = std::string("lm_head (") + dtype_name(target.dtype) + ")";
  if (!is_copy()) return head + " for the target and the drafts";
  return head + " for the target, an FP8 copy (" + std::to_string((copy_bytes() + (1 << 19)) >> 20) +
         " MiB) for the drafts";
}

}  // namespace nextn
