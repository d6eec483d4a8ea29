// CPU matmul entry points: validation, the Linear helpers and the thread split. The SIMD kernels live in
// matmul_hwy.cpp (Highway, one source compiled for AVX-512, AVX2 and a scalar fallback, dispatched at run
// time); see there for the numerics.
//
// Batch invariance: every output element y[m][n] is one dot product with a fixed reduction order on a given
// machine (and ISA target), whatever M, the tiling or the thread count. Threads split only the output
// columns (weight rows), never a reduction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "ops/cpu/matmul_kernels.h"
#include "ops/ops.h"

namespace nextn {

namespace {

int64_t stride_of(const Linear& w) { return w.row_stride > 0 ? w.row_stride : w.in; }

int64_t scale_cols_of(const Linear& w) {
  return w.scale_cols > 0 ? w.scale_cols : (w.in + w.block_in - 1) / w.block_in;
}

void check_supported(const Linear& w, const char* what) {
  switch (w.dtype) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
      return;
    case DType::F8_E4M3:
      if (w.scale == nullptr) throw Error(std::string(what) + ": F8_E4M3 weight without block scales");
      if (w.block_out <= 0 || w.block_in <= 0)
        throw Error(std::string(what) + ": F8_E4M3 weight with non-positive scale block size");
      if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::BF16 && w.scale_dtype != DType::F8_E8M0)
        throw Error(std::string(what) + ": unsupported FP8 scale dtype " + dtype_name(w.scale_dtype));
      return;
    default:
      throw Error(std::string(what) + ": unsupported weight dtype " + dtype_name(w.dtype));
  }
}

// Whether some scale s of the rows in use is finite with |s| >= 2^120 (biased exponent 247..254): the
// SIMD FP8 decoder pre-multiplies scales by 256, which must stay finite.
bool has_huge_scale(const matmul_kernels::Weight& k, int64_t r0, int64_t n) {
  const int64_t first = (k.scale_row0 + r0) / k.block_out, last = (k.scale_row0 + r0 + n - 1) / k.block_out;
  bool bad = false;
  for (int64_t i = first * k.scale_cols; i < (last + 1) * k.scale_cols; ++i) {
    const float s = std::fabs(matmul_kernels::load_scale(k, i));
    bad |= std::isfinite(s) && s >= 0x1p120f;
  }
  return bad;
}

// The kernels' view of a checked weight; FP8 scales are inspected for rows [r0, r0 + n) (all by default).
matmul_kernels::Weight kernel_weight(const Linear& w, int64_t r0 = 0, int64_t n = -1) {
  if (n < 0) n = w.out;
  matmul_kernels::Weight k;
  k.dtype = w.dtype;
  k.N = w.out;
  k.K = w.in;
  k.data = static_cast<const unsigned char*>(w.data);
  k.row_stride = stride_of(w);
  k.bias = w.bias;
  if (w.dtype == DType::F8_E4M3) {
    k.scale = static_cast<const unsigned char*>(w.scale);
    k.scale_dtype = w.scale_dtype;
    k.block_out = w.block_out;
    k.block_in = w.block_in;
    k.scale_cols = scale_cols_of(w);
    k.scale_row0 = w.scale_row0;
    k.fp8_table = w.block_in % 16 != 0 || (n > 0 && has_huge_scale(k, r0, n));
  }
  return k;
}

constexpr int64_t kRowBlock = 16;  // thread grain: output columns per chunk at least

// Whether a product is worth a hand-off to the pool: at least the pool's min_parallel_work() multiply-adds,
// or a few (<= 64) rows with at least 256 KB of weights (the f32 hyper-connection mixers and routers:
// memory-bound however few their multiply-adds).
bool worth_threads(const ThreadPool& pool, int64_t M, int64_t rows, int64_t K, size_t weight_bytes) {
  return M * rows * K >= pool.min_parallel_work() || (rows <= 64 && weight_bytes >= (size_t(256) << 10));
}

// Thread grain in output columns: kRowBlock, or fewer for long rows (at least 32 KB of weights per chunk).
int64_t row_grain(int64_t K, DType dtype) {
  const int64_t row_bytes = std::max<int64_t>(1, K * static_cast<int64_t>(dtype_size(dtype)));
  return std::clamp<int64_t>(((int64_t(32) << 10) + row_bytes - 1) / row_bytes, 1, kRowBlock);
}

}  // namespace

Linear Linear::rows(int64_t r0, int64_t n) const {
  if (r0 < 0 || n < 0 || r0 + n > out)
    throw Error("Linear::rows: rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                ") out of range for a weight with " + std::to_string(out) + " rows");
  Linear s = *this;
  const int64_t stride = stride_of(*this);
  s.out = n;
  s.row_stride = stride;
  s.data = static_cast<const unsigned char*>(data) + static_cast<size_t>(r0 * stride) * dtype_size(dtype);
  if (bias) s.bias = bias + r0;
  if (dtype == DType::F8_E4M3) {
    // A slice may start inside a scale block (e.g. `up` rows of a fused [2I, H] expert with I % 128 != 0):
    // point at the block row holding r0 and remember r0's offset inside it.
    if (block_out <= 0) throw Error("Linear::rows: FP8 weight with non-positive scale block height");
    s.scale_cols = scale_cols_of(*this);
    const int64_t first = scale_row0 + r0;
    s.scale_row0 = first % block_out;
    if (scale)
      s.scale = static_cast<const unsigned char*>(scale) +
                static_cast<size_t>((first / block_out) * s.scale_cols) * dtype_size(scale_dtype);
  }
  return s;
}

Linear Linear::columns(int64_t c0, int64_t n) const {
  if (c0 < 0 || n < 0 || c0 + n > in)
    throw Error("Linear::columns: columns [" + std::to_string(c0) + ", " + std::to_string(c0 + n) +
                ") out of range for a weight with " + std::to_string(in) + " columns");
  Linear s = *this;
  s.in = n;
  s.row_stride = stride_of(*this);
  s.data = static_cast<const unsigned char*>(data) + static_cast<size_t>(c0) * dtype_size(dtype);
  s.bias = nullptr;
  if (dtype == DType::F8_E4M3) {
    if (block_in <= 0 || c0 % block_in != 0)
      throw Error("Linear::columns: FP8 columns from " + std::to_string(c0) + " do not start a scale block of " +
                  std::to_string(block_in));
    s.scale_cols = scale_cols_of(*this);  // (the stride between scale rows stays the whole matrix's)
    if (scale)
      s.scale = static_cast<const unsigned char*>(scale) + static_cast<size_t>(c0 / block_in) * dtype_size(scale_dtype);
  }
  return s;
}

size_t Linear::weight_bytes() const {
  size_t bytes = static_cast<size_t>(out) * static_cast<size_t>(in) * dtype_size(dtype);
  if (dtype == DType::F8_E4M3 && scale && block_out > 0 && block_in > 0) {
    const int64_t scale_rows = (scale_row0 + out + block_out - 1) / block_out;
    bytes += static_cast<size_t>(scale_rows * ((in + block_in - 1) / block_in)) * dtype_size(scale_dtype);
  }
  if (bias) bytes += static_cast<size_t>(out) * sizeof(float);
  return bytes;
}

namespace ops {

// Decode-sized calls read every x row once per weight row group: rows that straddle cache lines cost a
// split load each time, so such x is copied to 64-byte aligned rows first when it fits a fixed per-thread
// buffer (the values, hence the results, are the same; larger x is read in place). The model's
// activations are aligned already; the buffer is not on the heap, so no thread ever allocates here.
void aligned_x(matmul_kernels::Job& job, const float* x, int64_t M, int64_t K, int64_t x_stride) {
  job.x = x;
  job.x_stride = x_stride;
  constexpr int64_t kBufFloats = 16384;  // 64 KB: 8 rows of 2048, 16 of 1024
  const int64_t pitch = (K + 15) / 16 * 16;
  if (M > 1 && M <= 16 && M * pitch <= kBufFloats &&
      (reinterpret_cast<uintptr_t>(x) % 64 != 0 || (job.x_stride * sizeof(float)) % 64 != 0)) {
    alignas(64) static thread_local float buf[kBufFloats];
    for (int64_t m = 0; m < M; ++m) std::memcpy(buf + m * pitch, x + m * x_stride, static_cast<size_t>(K) * 4);
    job.x = buf;
    job.x_stride = pitch;
  }
}

namespace {

// y_i = x · w_iᵀ (+ bias) for outputs that share x: their rows are split over the threads as one
// concatenated matrix. `what` names the entry point in errors.
void multiply(ThreadPool* pool, const float* x, int64_t M, const MatmulOut* outs, int64_t n_outs, int64_t x_stride,
              const char* what) {
  constexpr int64_t kMaxOuts = 16;
  if (n_outs > kMaxOuts) throw Error(std::string(what) + ": more than 16 outputs");
  // Everything the chunks read, behind one pointer.
  struct Call {
    matmul_kernels::Job base;
    matmul_kernels::Weight kws[kMaxOuts];
    int64_t first[kMaxOuts + 1] = {0};  // rows of the concatenation before output i
    const MatmulOut* outs;
    int64_t n_outs;
  } call;
  call.outs = outs;
  call.n_outs = n_outs;
  const int64_t K = outs[0].w->in;
  size_t bytes = 0;
  for (int64_t i = 0; i < n_outs; ++i) {
    const Linear& w = *outs[i].w;
    if (w.in != K) throw Error(std::string(what) + ": weights of different input widths");
    check_supported(w, what);
    call.kws[i] = kernel_weight(w);
    call.first[i + 1] = call.first[i] + w.out;
    bytes += w.weight_bytes();
  }
  const int64_t total = call.first[n_outs];
  if (total <= 0) return;
  call.base.M = M;
  aligned_x(call.base, x, M, K, x_stride < 0 ? K : x_stride);
  // Small products run on the caller alone (worth_threads), and so do mid-size ones while the workers sleep
  // until waking them pays (ThreadPool::worth_waking). Which thread computes an output never changes
  // its value: results stay batch invariant.
  ThreadPool* use = pool && worth_threads(*pool, M, total, K, bytes) &&
                            pool->worth_waking(M * total * K + static_cast<int64_t>(bytes))
                        ? pool
                        : nullptr;
  // Chunk [n0, n1) of the concatenated rows: the piece of every output it overlaps.
  parallel_for(use, total, row_grain(K, outs[0].w->dtype), [c = &call](int64_t n0, int64_t n1, int) {
    for (int64_t i = 0; i < c->n_outs; ++i) {
      const int64_t a = std::max(n0, c->first[i]), b = std::min(n1, c->first[i + 1]);
      if (a >= b) continue;
      const MatmulOut& o = c->outs[i];
      matmul_kernels::Job part = c->base;
      part.w = &c->kws[i];
      part.y = o.y;
      part.y_stride = o.y_stride < 0 ? o.w->out : o.y_stride;
      part.n0 = a - c->first[i];
      part.n1 = b - c->first[i];
      matmul_kernels::matmul_cols(part);
    }
  });
}

}  // namespace

void matmul(ThreadPool* pool, const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride,
            int64_t y_stride) {
  if (M <= 0 || w.out <= 0) return;
  const MatmulOut out{&w, y, y_stride};
  multiply(pool, x, M, &out, 1, x_stride, "matmul");
}

void matmul_many(ThreadPool* pool, const float* x, int64_t M, const MatmulOut* outs, int64_t n_outs,
                 int64_t x_stride) {
  if (M <= 0 || n_outs <= 0) return;
  multiply(pool, x, M, outs, n_outs, x_stride, "matmul_many");
}

void matmul_transposed(const float* x, const Linear& w, float* y) { matmul_transposed(x, 1, w.out, w, y, w.in); }

void matmul_transposed(const float* x, int64_t M, int64_t x_stride, const Linear& w, float* y, int64_t y_stride) {
  if (M <= 0 || w.out <= 0 || w.in <= 0) return;
  check_supported(w, "matmul_transposed");
  matmul_kernels::matmul_transposed(x, M, x_stride, kernel_weight(w), y, y_stride);
}

void dequant_row(const Linear& w, int64_t r, float* out) {
  check_supported(w, "dequant_row");
  if (r < 0 || r >= w.out)
    throw Error("dequant_row: row " + std::to_string(r) + " out of range [0, " + std::to_string(w.out) + ")");
  matmul_kernels::dequant_row(kernel_weight(w, r, 1), r, out);
}

}  // namespace ops
}  // namespace nextn
