// Small CPU kernels: norms, RoPE, activations, top-k. Each row is computed the same way whatever the
// batch, so the results are batch invariant.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "ops/ops.h"

namespace nextn::ops {

float dot(const float* a, const float* b, int64_t n) {
  // 8 independent lanes then a fixed tree: same order for every call of the same n.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float inv_rms(const float* x, int64_t d, float eps) {
  float ss = dot(x, x, d);
  return 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
}

void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, float eps, float* out,
              int64_t x_stride, int64_t out_stride) {
  if (x_stride < 0) x_stride = d;
  if (out_stride < 0) out_stride = d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* o = out + r * out_stride;
    float s = inv_rms(xr, d, eps);
    if (weight)
      for (int64_t i = 0; i < d; ++i) o[i] = weight[i] * (xr[i] * s);
    else
      for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * s;
  }
}

void layer_norm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, float eps,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* o = out + r * d;
    float mean = 0;
    for (int64_t i = 0; i < d; ++i) mean += xr[i];
    mean /= static_cast<float>(d);
    float var = 0;
    for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<float>(d);
    float s = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < d; ++i) o[i] = (xr[i] - mean) * s * weight[i] + bias[i];
  }
}

void rope_tables(const float* inv_freq, int64_t half, int64_t position, float attention_factor, float* cos,
                 float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    float f = inv_freq[i] * static_cast<float>(position);  // fp32 product, as the reference computes it
    cos[i] = std::cos(f) * attention_factor;
    sin[i] = std::sin(f) * attention_factor;
  }
}

void rope_rotate_half(float* x, int64_t dim, const float* cos, const float* sin) {
  int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

}  // namespace nextn::ops
