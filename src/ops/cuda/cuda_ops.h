// The CUDA kernels (P11's backend, first pieces): device memory, weights uploaded as stored (bf16 stays bf16,
// FP8 stays FP8 with its block scales), the decode/verify matmul and RMSNorm, and the device's copy
// bandwidth, the yardstick of a bandwidth-bound decode.
//
// Plain C++ on this side: no CUDA type appears here, so the rest of nextn compiles without the toolkit.
// A build without CUDA (no nvcc found, or a sanitizer build) links no_cuda.cpp instead, whose available()
// says why; everything else then throws.
//
// Batch invariance, as on the CPU (ops.h): a row's output is computed with the same instructions and the
// same reduction order whatever the number of rows M in the call, so a verify of k+1 rows gives each row
// exactly what a one-row decode step gives it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/ops.h"

namespace nextn::cuda {

// Whether a CUDA device can run the kernels; if not, why (built without CUDA, no driver, no device).
bool available(std::string* why = nullptr);
std::string device_name();  // "NVIDIA H200 (sm_90, 141 GB)"
size_t free_memory();       // bytes of device memory free now

// Device memory, freed with its owner (move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);  // host -> device (synchronous)
  void download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A Linear whose weight, FP8 scales and bias live on the device; `w` is its descriptor with device pointers
// (the layout, dtypes and block sizes of the host Linear it came from).
struct DeviceLinear {
  Linear w;
  DeviceBuffer data, scale, bias;
};
// Copies w's bytes to the device once (its rows, its scale rows, its bias). Throws for a dtype the kernels
// do not take (F32, BF16 and F8_E4M3 with F32, BF16 or E8M0 scales are taken).
DeviceLinear upload(const Linear& w);

// What a kernel does with each output value v of row m, column n besides y[m, n] = v: the residual updates
// that follow a block's last matmul, done as it stores (each saves a launch and a pass over the rows). With
// `accumulate`, y[m, n] = y[m, n] + v (a residual add into y); with `streams`, after the store, streams[m, j,
// n] = post[m, j] · y[m, n] + streams[m, j, n] for j < C (the hyper-connection post; streams [M, C, H], post
// [M, C]). Each value gets the bits of the separate ops (cuda::add, cuda::hc_post).
struct OutputSink {
  bool accumulate = false;
  float* streams = nullptr;
  const float* post = nullptr;
  int64_t C = 0, H = 0;
};

// y[M, w.out] = x[M, w.in] · wᵀ (+ bias), all pointers on the device (w from upload()), rows x_stride and
// y_stride floats apart (default w.in, w.out), stored through `sink`. For decode and verify widths (any M; the
// weights are read once per 8 rows). Asynchronous on the default stream: synchronize() before reading y on
// the host.
void matmul(const float* x, int64_t M, const Linear& w, float* y, int64_t x_stride = -1, int64_t y_stride = -1,
            const OutputSink& sink = {});
// ops::matmul_many on the device: several matmuls of the same x [M, in] (a layer's projections of its
// normalized rows), y_i = x · w_iᵀ, in as few launches as the kernels allow: the FP8 ones that take the
// tensor-core path share one, the others get one each. Each y_i gets the bits matmul() gives it.
void matmul_many(const float* x, int64_t M, const ops::MatmulOut* outs, int64_t n_outs);
// Weights of one shape and dtype (a layer's MoE experts) as a table on the device, for grouped_matmul. The
// Linears are device ones (from upload()).
struct WeightTable {
  DeviceBuffer descriptors;
  Linear shape;        // the first weight's (every weight has its shape and dtype)
  int64_t count = 0;
  bool vectors = false;  // every weight's rows take 16-byte loads
};
WeightTable weight_table(const Linear* const* weights, int64_t n);
// For each e < table.count: y[r] = x[r] · table[e]ᵀ for rows r in [first[e], first[e + 1]) (first: n + 1
// offsets on the device, so the launch needs no host round trip). Each row gets the bits matmul()'s CUDA-core
// kernel gives it, whichever rows share its weight.
// rows: first[n], the total (known on the host, which splits the rows into chunks for the grid).
void grouped_matmul(const float* x, const WeightTable& table, const int32_t* first, int64_t rows, float* y,
                    int64_t x_stride = -1, int64_t y_stride = -1);
// out[r] = x[r] * rsqrt(mean(x[r]²) + eps) * weight (weight may be null), rows of width d on the device.
void rms_norm(const float* x, int64_t rows, int64_t d, const float* weight, float eps, float* out);
void synchronize();  // waits for the device; throws with CUDA's message if a kernel failed

// The kernels a thread queues between begin_capture() and end_capture() are recorded (a CUDA graph) instead of
// run, and launch() replays them with their arguments as recorded: one launch for a whole forward. (Every
// kernel goes to the calling thread's default stream: the CUDA code is built with --default-stream
// per-thread.) Nothing may wait for the device while recording.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch() const;

 private:
  friend Graph end_capture();
  [[maybe_unused]] void* exec_ = nullptr;  // (a build without CUDA, no_cuda.cpp, never reads it)
};
void begin_capture();
Graph end_capture();
void abandon_capture();  // ends a recording left open (a forward that threw), discarding it

// A branch: the kernels a thread queues between branch_begin() and branch_end() go to a second stream, where
// they follow everything queued before branch_begin() and run beside what the thread queues after
// branch_end(); after branch_join() the thread's kernels follow the branch's too. (A graph records the two
// streams as two branches of its dependency graph.) On unless NEXTN_CUDA_BRANCHES=0; off, every call does
// nothing and the kernels run in the order queued.
bool branches_on();
void set_branches(bool on);  // (for tests: the same bits either way)
void branch_begin();
void branch_end();
void branch_join();

// Seconds per call of fn(), averaged over `iters` calls after one warm-up, timed with device events.
double time_device(int iters, void (*fn)(void*), void* arg);
// Device-to-device copy bandwidth in GB/s ((read + write bytes) / time) over a `bytes` buffer: the most a
// kernel that streams memory can expect.
double copy_bandwidth_gbps(size_t bytes, int iters = 10);

}  // namespace nextn::cuda
