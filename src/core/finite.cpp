#include "core/finite.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace nextn {

NonFiniteCount count_non_finite(const float* x, int64_t n) {
  NonFiniteCount c;
  if (all_finite(x, n)) return c;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) {
      if (c.count++ == 0) c.first = i;
    }
  return c;
}

bool all_finite(const float* x, int64_t n) {
  // The largest magnitude's bits: an exponent of all ones (inf, NaN) is the only pattern at or above 0x7f800000.
  uint32_t worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    worst = std::max(worst, bits & 0x7fffffffu);
  }
  return worst < 0x7f800000u;
}

int32_t finite_argmax(const float* x, int64_t n) {
  if (n <= 0 || !all_finite(x, n)) return -1;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

void finite_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = finite_argmax(x + r * n, n);
}

void require_finite(const float* x, int64_t rows, int64_t cols, const std::string& what) {
  if (all_finite(x, rows * cols)) return;
  const NonFiniteCount bad = count_non_finite(x, rows * cols);
  throw Error(what + " hold " + std::to_string(bad.count) + " non-finite value(s) (NaN or inf), the first at row " +
              std::to_string(bad.first / cols) + ", column " + std::to_string(bad.first % cols) +
              "; check the checkpoint with `nextn inspect --scan`");
}

namespace {

// Whether any of the n elements at `data` (type T, possibly unaligned) has (v & mask) >= at: the
// non-finite patterns of every float dtype are the top of its magnitude range. A max reduction, which
// vectorizes to a few instructions per vector, so the common clean tensor is read at memory speed.
template <class T>
bool any_magnitude_at_or_above(const void* data, int64_t n, T mask, T at) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  T worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes + i * int64_t(sizeof(T)), sizeof(T));
    worst = std::max<T>(worst, static_cast<T>(v & mask));
  }
  return worst >= at;
}

// How many of the n elements (as above) are non-finite, and the first; 0 at once for a clean tensor.
template <class T>
NonFiniteCount count_bad(const void* data, int64_t n, T mask, T at) {
  NonFiniteCount c;
  if (!any_magnitude_at_or_above<T>(data, n, mask, at)) return c;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes + i * int64_t(sizeof(T)), sizeof(T));
    if (static_cast<T>(v & mask) >= at && c.count++ == 0) c.first = i;
  }
  return c;
}

}  // namespace

bool count_non_finite(const TensorView& t, NonFiniteCount& out) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::F32:  // exponent all ones
      out = count_bad<uint32_t>(t.data, n, 0x7fffffffu, 0x7f800000u);
      return true;
    case DType::F64:
      out = count_bad<uint64_t>(t.data, n, 0x7fffffffffffffffull, 0x7ff0000000000000ull);
      return true;
    case DType::BF16:
      out = count_bad<uint16_t>(t.data, n, 0x7fff, 0x7f80);
      return true;
    case DType::F16:
      out = count_bad<uint16_t>(t.data, n, 0x7fff, 0x7c00);
      return true;
    case DType::F8_E4M3:  // float8_e4m3fn has no inf; S.1111.111 is NaN
      out = count_bad<uint8_t>(t.data, n, 0x7f, 0x7f);
      return true;
    case DType::F8_E8M0:  // 0xff is NaN
      out = count_bad<uint8_t>(t.data, n, 0xff, 0xff);
      return true;
    default:
      return false;
  }
}

NonFiniteCount count_non_finite_ue8m0(const TensorView& t) { return count_bad<uint8_t>(t.data, t.numel(), 0xff, 0xff); }

}  // namespace nextn
