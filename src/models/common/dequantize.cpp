#include "models/common/dequantize.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace nextn {

Linear dequantized(const Linear& q, std::vector<uint8_t>& buf, NonFiniteCount& bad) {
  std::vector<float> f(static_cast<size_t>(q.out * q.in));
  for (int64_t r = 0; r < q.out; ++r) ops::dequant_row(q, r, f.data() + r * q.in);
  bad = count_non_finite(f.data(), q.out * q.in);
  const bool bf16 = std::all_of(f.begin(), f.end(), [](float v) { return round_to_bf16(v) == v; });
  Linear d;
  d.dtype = bf16 ? DType::BF16 : DType::F32;
  d.out = q.out;
  d.in = q.in;
  d.row_stride = q.in;
  d.bias = q.bias;
  if (bf16) {
    buf.resize(f.size() * 2);
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t h = f32_to_bf16(f[i]);
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  } else {
    buf.resize(f.size() * 4);
    std::memcpy(buf.data(), f.data(), buf.size());
  }
  d.data = buf.data();
  return d;
}

}  // namespace nextn
