// How the kernels are launched: each may start while the kernel before it in the stream is still running
// (programmatic dependent launch, sm_90), so that a decode step's ~30 kernels a layer do not each pay a
// launch's latency and a grid's drain in series, and a matmul streams its weights (which no kernel writes)
// into L2 while its predecessor still runs. Included by the .cu files only.
//
// The contract, kept by every kernel of ops/cuda: it calls begin_after_predecessor() before it reads
// anything an earlier kernel writes or writes anything an earlier kernel reads; before that it may only read
// weights. The predecessor's results are then complete and visible, and since every kernel waits so, a
// kernel's wait also covers every kernel before it. NEXTN_CUDA_OVERLAP=0 launches them in plain stream order
// (the waits then return at once). Nothing here changes a value: only when a kernel starts.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/device_weight.cuh"

namespace nextn::cuda {

void* launch_stream();  // the stream the thread's kernels go to now (cuda_ops.cu: branch_begin / branch_end)

namespace {

// Waits until the kernel before this one has finished and its writes are visible, then lets the next
// kernel's blocks be scheduled (they start as SMs free up, and wait in turn before touching its results).
__device__ __forceinline__ void begin_after_predecessor() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Asks L2 for `bytes` from p (16-byte aligned; rounded down to whole 16 bytes), in 64 KB pieces spread
// over the calling threads `t` of `threads`. A hint: nothing waits for it, and it reads only weights.
__device__ __forceinline__ void prefetch_l2(const unsigned char* p, int64_t bytes, int t, int threads) {
  constexpr int64_t kPiece = 64 * 1024;
  bytes &= ~int64_t(15);
  for (int64_t off = int64_t(t) * kPiece; off < bytes; off += int64_t(threads) * kPiece) {
    const int64_t n = bytes - off < kPiece ? bytes - off : kPiece;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(unsigned(n)) : "memory");
  }
}

// Prefetches the first w.prefetch_row_bytes of each of w's rows [n0, n0 + rows) (device_weight() sets how
// many: all of a row when the whole matrix fits the L2 budget, less when not, none when rows are unaligned).
__device__ __forceinline__ void prefetch_weight_rows(const DeviceWeight& w, int64_t n0, int64_t rows) {
  if (w.prefetch_row_bytes <= 0 || n0 >= w.out) return;
  if (n0 + rows > w.out) rows = w.out - n0;
  const int64_t stride = w.row_stride * w.elem_bytes;
  const unsigned char* first = w.data + n0 * stride;
  if (stride == w.prefetch_row_bytes)  // contiguous rows: one span
    return prefetch_l2(first, rows * stride, int(threadIdx.x), int(blockDim.x));
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) prefetch_l2(first + r * stride, w.prefetch_row_bytes, 0, 1);
}

// The device's SM count (launch shapes that fill it).
inline int multiprocessors() {
  static const int sms = [] {
    int device = 0, n = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    return n > 1 ? n : 1;
  }();
  return sms;
}

// The rows of an M-row call split into chunks of whole passes (multiples of `pass` rows), one per grid.y, so
// that col_blocks x chunks blocks fill the device twice over: a block runs its passes one after another, and
// on a narrow matrix (few column blocks) 64 rows in one block took 8-16 passes in series. A row's value does
// not depend on its chunk (each row is summed alone), so the split may follow M.
struct RowChunks {
  unsigned chunks;
  int64_t rows_per_chunk;
};

inline RowChunks row_chunks(int64_t col_blocks, int64_t M, int64_t pass) {
  const int64_t target = 2 * int64_t(multiprocessors());
  const int64_t passes = (M + pass - 1) / pass;
  const int64_t chunks = std::clamp<int64_t>((target + col_blocks - 1) / col_blocks, 1, std::min<int64_t>(passes, 65535));
  const int64_t per = (passes + chunks - 1) / chunks * pass;
  return {unsigned((M + per - 1) / per), per};
}

// Calls launch(r0, rows) for consecutive chunks of M rows, each at most what a grid's y or z dimension takes
// in blocks of `per_block` rows (65535 of them): kernels that give each block of rows a grid index take any M.
template <class Launch>
void for_row_chunks(int64_t M, int64_t per_block, Launch&& launch) {
  const int64_t most = int64_t(65535) * per_block;
  for (int64_t r0 = 0; r0 < M; r0 += most) launch(r0, std::min(M - r0, most));
}

inline bool overlapping_launches() {
  static const bool on = [] {
    const char* e = std::getenv("NEXTN_CUDA_OVERLAP");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// kernel<<<grid, block, smem, the per-thread stream>>>(args...), allowed to overlap its predecessor; with
// `cluster` (sm_90 thread block clusters, at most 8 blocks: the portable size), the grid's blocks are launched
// in clusters of that shape, whose blocks run at once and may read each other's shared memory.
template <typename... Params, typename... Args>
void launch_kernel_clustered(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                             const char* what, Args... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (overlapping_launches()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = static_cast<cudaStream_t>(launch_stream());
  config.attrs = attrs;
  config.numAttrs = n;
  check(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...), what);
}
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, const char* what, Args... args) {
  launch_kernel_clustered(kernel, grid, dim3(1, 1, 1), block, smem, what, args...);
}

}  // namespace
}  // namespace nextn::cuda
