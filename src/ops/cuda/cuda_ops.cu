// CUDA kernels behind cuda_ops.h. Compiled with --fmad=false: every fused multiply-add is written out
// (fmaf), so that no contraction the compiler chooses can round one row differently from another.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>


#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace nextn::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

size_t elem_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::F8_E8M0: return 1;
    default: return 0;
  }
}

// ---- the matmul ------------------------------------------------------------------------------------------

enum class WeightKind { kF32, kBF16, kFP8 };

struct DeviceWeight {
  const unsigned char* data;
  int64_t out, in, row_stride;  // elements
  const unsigned char* scale;
  int scale_kind;               // 0 f32, 1 bf16, 2 e8m0
  int64_t block_out, block_in, scale_cols, scale_row0;
  const float* bias;
};

constexpr int kWarpsPerBlock = 8;  // a block's warps split each weight row's vectors (fixed: it sets the order)
constexpr int kVecBytes = 16;

__device__ __forceinline__ float bf16_bits_to_f32(unsigned short v) { return __uint_as_float(unsigned(v) << 16); }

// The scale row of weight row n (computed once per row: 64-bit divisions cost more than the loads).
__device__ __forceinline__ const unsigned char* scale_row(const DeviceWeight& w, int64_t n, int scale_bytes) {
  return w.scale + ((w.scale_row0 + n) / w.block_out) * w.scale_cols * scale_bytes;
}

__device__ __forceinline__ float scale_value(const unsigned char* row, int kind, unsigned col) {
  switch (kind) {
    case 0: return reinterpret_cast<const float*>(row)[col];
    case 1: return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(row)[col]);
    default: {
      const unsigned char e = row[col];
      if (e == 0xff) return __int_as_float(0x7fc00000);
      return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e) << 23);  // 2^(e - 127)
    }
  }
}

__device__ __forceinline__ float fp8_to_f32(unsigned char v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// One element of row n (the scalar path: tails, and layouts the vector loads cannot take).
template <WeightKind K>
__device__ __forceinline__ float weight_at(const DeviceWeight& w, const unsigned char* srow, int64_t n, int64_t k) {
  const int64_t i = n * w.row_stride + k;
  if constexpr (K == WeightKind::kF32) return reinterpret_cast<const float*>(w.data)[i];
  if constexpr (K == WeightKind::kBF16) return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(w.data)[i]);
  if constexpr (K == WeightKind::kFP8) return fp8_to_f32(w.data[i]) * scale_value(srow, w.scale_kind, unsigned(k / w.block_in));
}

// The 16 bytes of row n's vector v decoded to floats (FP8: its block scale applied, as the CPU dequantizes).
template <WeightKind K>
struct Vec {
  static constexpr int kElems = K == WeightKind::kF32 ? 4 : K == WeightKind::kBF16 ? 8 : 16;
  __device__ __forceinline__ static void load(const DeviceWeight& w, const unsigned char* srow, unsigned vec_per_block,
                                              int64_t n, int64_t v, float* out) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w.data + (n * w.row_stride + v * kElems) * (16 / kElems)));
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (K == WeightKind::kF32) {
      for (int e = 0; e < 4; ++e) out[e] = __uint_as_float(words[e]);
    } else if constexpr (K == WeightKind::kBF16) {
      for (int e = 0; e < 4; ++e) {
        out[2 * e] = __uint_as_float(words[e] << 16);
        out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
      }
    } else {
      const float s = scale_value(srow, w.scale_kind, unsigned(v) / vec_per_block);
      for (int e = 0; e < 4; ++e)
        for (int b = 0; b < 4; b += 2) {
          const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
              static_cast<__nv_fp8x2_storage_t>((words[e] >> (8 * b)) & 0xffffu), __NV_E4M3);
          const float2 f = __half22float2(__half2(h2));
          out[4 * e + b] = f.x * s;
          out[4 * e + b + 1] = f.y * s;
        }
    }
  }

  // acc += Σ_e out[e] · x[e] in element order, out being load()'s values, decoded as they are consumed: the
  // same FMA chain as load() then a loop over e, without E decoded floats live per column (with C = 4 FP8
  // columns those held 64 registers, which capped the kernel at 2 blocks per SM and its DRAM reads at 24%).
  __device__ __forceinline__ static float fma_into(const DeviceWeight& w, const unsigned char* srow,
                                                   unsigned vec_per_block, int64_t n, int64_t v, const float* x,
                                                   float acc) {
    if constexpr (K != WeightKind::kFP8) {
      float out[kElems];
      load(w, srow, vec_per_block, n, v, out);
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc = fmaf(out[e], x[e], acc);
      return acc;
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w.data + n * w.row_stride + v * kElems));
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
      const float s = scale_value(srow, w.scale_kind, unsigned(v) / vec_per_block);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int b = 0; b < 4; b += 2) {
          const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(
              static_cast<__nv_fp8x2_storage_t>((words[e] >> (8 * b)) & 0xffffu), __NV_E4M3);
          const float2 f = __half22float2(__half2(h2));
          acc = fmaf(f.x * s, x[4 * e + b], acc);
          acc = fmaf(f.y * s, x[4 * e + b + 1], acc);
        }
      return acc;
    }
  }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// E floats of activation row xr from element k: float4 loads where the row allows them.
template <int E>
__device__ __forceinline__ void load_x(const float* xr, bool x_vectors, float* out) {
  if (x_vectors) {
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(xr + e));
      out[e] = q.x, out[e + 1] = q.y, out[e + 2] = q.z, out[e + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = __ldg(xr + e);
  }
}

// y[m, n] for m in [0, M) and the block's C columns n (weight rows), R activation rows per pass over the
// weights, U weight vectors per thread in flight. Thread t of the block takes the vectors t, t + 256, ... of
// each of its columns (then the scalar tail, likewise), so that the C columns share each load of x; each
// (row, column) accumulates in its own register in that order, a warp's sums meet in a fixed butterfly and
// the block's 8 warps' sums are added in warp order. None of it depends on M, C, R or U, so the launch
// shape can follow M (launch() below) and every row still gets the value the one-row call gives it.
template <WeightKind K, int C, int R, int U>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matmul_kernel(const float* __restrict__ x, int64_t M, int64_t xs, DeviceWeight w, float* __restrict__ y,
                  int64_t ys, bool vectors, bool x_vectors) {
  using V = Vec<K>;
  constexpr int E = V::kElems, kThreads = kWarpsPerBlock * 32;
  __shared__ float part[kWarpsPerBlock][C][R];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = int64_t(blockIdx.x) * C;
  const int cols = int(w.out - n0 < C ? w.out - n0 : C);
  const int scale_bytes = w.scale_kind == 0 ? 4 : w.scale_kind == 1 ? 2 : 1;
  const unsigned char* srow[C];
#pragma unroll
  for (int c = 0; c < C; ++c) srow[c] = K == WeightKind::kFP8 ? scale_row(w, n0 + (c < cols ? c : 0), scale_bytes) : nullptr;
  const unsigned vec_per_block = K == WeightKind::kFP8 ? unsigned(w.block_in / E) : 1u;
  const int64_t nvec = vectors ? w.in / E : 0;
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    const int rows = int(M - m0 < R ? M - m0 : R);
    float acc[C][R];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[c][r] = 0.f;
    const float* xm = x + m0 * xs;
#pragma unroll U
    for (int64_t v = tid; v < nvec; v += kThreads) {
      if constexpr (R == 1) {  // one activation row: decode each weight as it is consumed
        float xv[E];
        load_x<E>(xm + v * E, x_vectors, xv);
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (c < cols) acc[c][0] = V::fma_into(w, srow[c], vec_per_block, n0 + c, v, xv, acc[c][0]);
      } else {  // several rows: each decoded weight serves them all
        float wv[C][E];
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (c < cols) V::load(w, srow[c], vec_per_block, n0 + c, v, wv[c]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= rows) break;
          float xv[E];
          load_x<E>(xm + r * xs + v * E, x_vectors, xv);
#pragma unroll
          for (int c = 0; c < C; ++c)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[c][r] = fmaf(wv[c][e], xv[e], acc[c][r]);
        }
      }
    }
    for (int64_t k = nvec * E + tid; k < w.in; k += kThreads) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c >= cols) break;
        const float wk = weight_at<K>(w, srow[c], n0 + c, k);
        for (int r = 0; r < rows; ++r) acc[c][r] = fmaf(wk, __ldg(xm + r * xs + k), acc[c][r]);
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float s = warp_sum(acc[c][r]);
        if (lane == 0) part[warp][c][r] = s;
      }
    __syncthreads();
    if (tid < C * R) {
      const int c = tid / R, r = tid % R;
      if (c < cols && r < rows) {
        float s = part[0][c][r];
        for (int wi = 1; wi < kWarpsPerBlock; ++wi) s += part[wi][c][r];
        y[(m0 + r) * ys + n0 + c] = w.bias ? s + w.bias[n0 + c] : s;
      }
    }
    __syncthreads();
  }
}


template <WeightKind K, int C, int R, int U>
void launch_shape(const float* x, int64_t M, int64_t xs, const DeviceWeight& w, float* y, int64_t ys, bool vectors,
                  bool x_vectors) {
  const dim3 grid(unsigned((w.out + C - 1) / C)), block(kWarpsPerBlock * 32);
  matmul_kernel<K, C, R, U><<<grid, block>>>(x, M, xs, w, y, ys, vectors, x_vectors);
}

template <WeightKind K>
void launch(const float* x, int64_t M, int64_t xs, const DeviceWeight& w, float* y, int64_t ys, bool vectors,
            bool x_vectors) {
  // (measured on the H200 with bench/cuda: a decode row reads bf16 best with 2 columns per block, FP8 with 4)
  if (M == 1 && K == WeightKind::kFP8) return launch_shape<K, 4, 1, 2>(x, M, xs, w, y, ys, vectors, x_vectors);
  if (M == 1) return launch_shape<K, 2, 1, 2>(x, M, xs, w, y, ys, vectors, x_vectors);
  if (M == 2) return launch_shape<K, 2, 2, 2>(x, M, xs, w, y, ys, vectors, x_vectors);
  if (M <= 4) return launch_shape<K, 4, 4, 1>(x, M, xs, w, y, ys, vectors, x_vectors);
  launch_shape<K, 4, 8, 1>(x, M, xs, w, y, ys, vectors, x_vectors);
}

// ---- RMSNorm ---------------------------------------------------------------------------------------------

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* __restrict__ x, int64_t d, const float* __restrict__ weight, float eps,
                    float* __restrict__ out) {
  __shared__ float part[kNormThreads];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* o = out + int64_t(blockIdx.x) * d;
  float s = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += kNormThreads) s = fmaf(xr[k], xr[k], s);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = kNormThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  const float inv = 1.0f / sqrtf(part[0] / float(d) + eps);
  for (int64_t k = threadIdx.x; k < d; k += kNormThreads) o[k] = weight ? xr[k] * inv * weight[k] : xr[k] * inv;
}

struct CopyArgs {
  void* dst;
  const void* src;
  size_t bytes;
};

}  // namespace

// ---- device and memory -----------------------------------------------------------------------------------

bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no usable CUDA driver or device: ") + cudaGetErrorString(e)
                                     : std::string("no CUDA device");
    return false;
  }
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  if (p.major < 9) {
    if (why) *why = std::string("the kernels are built for sm_90 (Hopper); device 0 is ") + p.name;
    return false;
  }
  return true;
}

std::string device_name() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) check(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) throw Error("DeviceBuffer::upload: past the end of the buffer");
  check(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice), "upload");
}
void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) throw Error("DeviceBuffer::download: past the end of the buffer");
  check(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost), "download");
}

DeviceLinear upload(const Linear& w) {
  const size_t es = elem_size(w.dtype);
  if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F8_E4M3)
    throw Error(std::string("cuda::upload: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  if (w.out <= 0 || w.in <= 0 || w.row_stride < w.in) throw Error("cuda::upload: bad weight shape");
  DeviceLinear d;
  d.w = w;
  const size_t bytes = size_t((w.out - 1) * w.row_stride + w.in) * es;
  d.data = DeviceBuffer(bytes);
  d.data.upload(w.data, bytes);
  d.w.data = d.data.get();
  if (w.dtype == DType::F8_E4M3) {
    if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::BF16 && w.scale_dtype != DType::F8_E8M0)
      throw Error(std::string("cuda::upload: FP8 scales of dtype ") + dtype_name(w.scale_dtype) + " are not supported");
    if (w.block_out <= 0 || w.block_in <= 0 || w.scale_cols < (w.in + w.block_in - 1) / w.block_in)
      throw Error("cuda::upload: bad FP8 block scales");
    const int64_t scale_rows = (w.scale_row0 + w.out + w.block_out - 1) / w.block_out;
    const size_t sbytes = size_t(scale_rows * w.scale_cols) * elem_size(w.scale_dtype);
    d.scale = DeviceBuffer(sbytes);
    d.scale.upload(w.scale, sbytes);
    d.w.scale = d.scale.get();
  }
  if (w.bias) {
    d.bias = DeviceBuffer(size_t(w.out) * 4);
    d.bias.upload(w.bias, size_t(w.out) * 4);
    d.w.bias = d.bias.f32();
  }
  return d;
}

// ---- ops -------------------------------------------------------------------------------------------------

void matmul(const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride, int64_t y_stride) {
  if (M <= 0) return;
  const int64_t xs = x_stride < 0 ? w.in : x_stride, ys = y_stride < 0 ? w.out : y_stride;
  DeviceWeight dw{static_cast<const unsigned char*>(w.data), w.out, w.in, w.row_stride,
                  static_cast<const unsigned char*>(w.scale),
                  w.scale_dtype == DType::F32 ? 0 : w.scale_dtype == DType::BF16 ? 1 : 2,
                  w.block_out, w.block_in, w.scale_cols, w.scale_row0, w.bias};
  const size_t es = elem_size(w.dtype);
  const int64_t elems = int64_t(kVecBytes / es);
  // 16-byte weight loads need aligned rows; an FP8 vector must sit inside one scale block.
  const bool vectors = reinterpret_cast<uintptr_t>(w.data) % kVecBytes == 0 && (w.row_stride * int64_t(es)) % kVecBytes == 0 &&
                       (w.dtype != DType::F8_E4M3 || w.block_in % elems == 0);
  // float4 loads of x need 16-byte aligned rows (they change no value: the products are summed in the same order).
  const bool x_vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 && xs % 4 == 0;
  // The launch shape follows M (launch()): for verify rows, more columns share x and rows share the weights.
  switch (w.dtype) {
    case DType::F32: launch<WeightKind::kF32>(x, M, xs, dw, y, ys, vectors, x_vectors); break;
    case DType::BF16: launch<WeightKind::kBF16>(x, M, xs, dw, y, ys, vectors, x_vectors); break;
    case DType::F8_E4M3: launch<WeightKind::kFP8>(x, M, xs, dw, y, ys, vectors, x_vectors); break;
    default: throw Error(std::string("cuda::matmul: weights of dtype ") + dtype_name(w.dtype) + " are not supported");
  }
  check(cudaGetLastError(), "matmul launch");
}

void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, float eps, float* out) {
  if (rows <= 0) return;
  rms_norm_kernel<<<unsigned(rows), kNormThreads>>>(x, d, weight, eps, out);
  check(cudaGetLastError(), "rms_norm launch");
}

void synchronize() { check(cudaDeviceSynchronize(), "kernel"); }

double time_device(int iters, void (*fn)(void*), void* arg) {
  fn(arg);
  synchronize();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) fn(arg);
  check(cudaEventRecord(b), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3 / std::max(iters, 1);
}

double copy_bandwidth_gbps(size_t bytes, int iters) {
  const size_t half = bytes / 2;
  DeviceBuffer buf(2 * half);
  check(cudaMemset(buf.get(), 1, 2 * half), "cudaMemset");
  CopyArgs args{buf.get(), static_cast<char*>(buf.get()) + half, half};
  const double s = time_device(iters, [](void* p) {
    auto* a = static_cast<CopyArgs*>(p);
    check(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  }, &args);
  return 2.0 * double(half) / s / 1e9;
}

}  // namespace nextn::cuda
