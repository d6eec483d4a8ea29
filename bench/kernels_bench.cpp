// Kernel micro-benchmarks (Google Benchmark): how close ops::matmul gets to streaming its weights at the
// machine's memory read bandwidth.
//
//   ./build/bin/nextn_bench_kernels                       # everything, 1 and 2 threads
//   NEXTN_BENCH_THREADS=1,4,16 ./build/bin/nextn_bench_kernels --benchmark_filter=bf16
//
// Every benchmark streams from a working set larger than the last-level cache (NEXTN_BENCH_WORKING_SET_MB,
// default 1536 MiB, so several copies of the weight are cycled through): each call reads its weights from
// DRAM, as a decode step over a model far bigger than the cache does.
//
// Counters:
//   GB/s     weight bytes (incl. FP8 block scales) streamed per second of wall time;
//   read_GB/s  the plain read bandwidth of the same working-set size and thread count, measured in this run
//              (the best of BM_ReadBandwidth's 1, 4 and 8 streams per thread, measured once per thread count
//              and cached);
//   pct_read   100 * GB/s / read_GB/s.
// Names: BM_Matmul/<dtype>/<N>x<K>/M:<rows>/threads:<t>; BM_MatmulHot/... is the same kernel on one small
// cache-resident weight (its compute rate, no memory limit).
// Environment: NEXTN_BENCH_THREADS (thread counts, default 1,2), NEXTN_BENCH_WORKING_SET_MB (default 1536),
// NEXTN_BENCH_TARGET (force a Highway target: AVX3, AVX2, SCALAR), NEXTN_BENCH_X_OFFSET (activation
// misalignment in floats from a 64-byte boundary, default 4). bench/compare_kernels.py turns the JSON
// output (--benchmark_out=F --benchmark_out_format=json) into the tables of docs/performance.md.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/splitmix.h"
#include "core/threadpool.h"
#include "ops/ops.h"
#if __has_include("ops/cpu/matmul_kernels.h")  // (absent when this file benchmarks the pre-Highway kernels)
#include "hwy/targets.h"
#include "ops/cpu/matmul_kernels.h"
#define NEXTN_BENCH_HWY 1
#endif

namespace nextn {
namespace {

size_t working_set_bytes() {
  const char* env = std::getenv("NEXTN_BENCH_WORKING_SET_MB");
  const long mb = env ? std::atol(env) : 1536;
  return static_cast<size_t>(std::max(1L, mb)) << 20;
}

std::vector<int> thread_counts() {
  std::vector<int> out;
  const char* env = std::getenv("NEXTN_BENCH_THREADS");
  std::string s = env ? env : "1,2";
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!tok.empty()) out.push_back(std::max(1, std::atoi(tok.c_str())));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out.empty()) out.push_back(1);
  return out;
}

// One pool per thread count, created on first use (1 thread = serial, no pool).
ThreadPool* pool_for(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (threads <= 1) return nullptr;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

// splitmix64: cheap, good-enough random bytes (the sequence splitmix64(s), splitmix64(s + golden), ...).
struct Rng {
  uint64_t s;
  uint64_t next() {
    const uint64_t z = splitmix64(s);
    s += 0x9e3779b97f4a7c15ull;
    return z;
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

// ---- memory read bandwidth ---------------------------------------------------------------------------

struct ReadBuffer {
  std::vector<uint64_t> data;
  ReadBuffer() : data(working_set_bytes() / 8) {
    Rng rng{1};
    for (auto& v : data) v = rng.next();
  }
};

ReadBuffer& read_buffer() {
  static ReadBuffer b;
  return b;
}

// Sums [begin, end) of the buffer as 64-bit integers with 256-bit loads, reading `streams` equal
// sub-ranges side by side (one core's bandwidth grows with the number of concurrent sequential streams the
// hardware prefetchers track). 8 accumulators: the loop is bound by the loads alone.
uint64_t sum_range(const uint64_t* p, int64_t begin, int64_t end, int streams) {
  constexpr int64_t kStep = 32;  // uint64 per stream per iteration (256 bytes)
  const int64_t n = end - begin;
  const int64_t per = n / streams / kStep * kStep;
  __m256i acc[8];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < per; i += kStep)
    for (int s = 0; s < streams; ++s) {
      const uint64_t* q = p + begin + s * per + i;
      for (int j = 0; j < 8; ++j)
        acc[j] = _mm256_add_epi64(acc[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 4 * j)));
    }
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_epi64(acc[0], acc[j]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (int64_t i = begin + streams * per; i < end; ++i) sum += p[i];
  return sum;
}

// One full pass over the buffer, split across `threads` like the matmul splits its rows.
double read_pass(int threads, int streams) {
  const ReadBuffer& b = read_buffer();
  const int64_t n = static_cast<int64_t>(b.data.size());
  std::vector<uint64_t> partial(static_cast<size_t>(std::max(threads, 1)) * 8, 0);
  parallel_for(pool_for(threads), n, 1 << 16, [&](int64_t b0, int64_t b1, int ti) {
    partial[static_cast<size_t>(ti) * 8] = sum_range(b.data.data(), b0, b1, streams);
  });
  uint64_t s = 0;
  for (uint64_t v : partial) s += v;
  return static_cast<double>(s & 1);
}

constexpr int kStreamCounts[] = {1, 4, 8};

// Read bandwidth in GB/s for `threads`: the best pass over 1, 4 and 8 streams per thread (3 passes each),
// measured once and cached, for the pct_read counter.
double read_bandwidth_gbs(int threads) {
  static std::map<int, double> cache;
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  double best = 0.0;
  const double bytes = static_cast<double>(read_buffer().data.size() * 8);
  read_pass(threads, 1);  // warm-up (page faults)
  for (int streams : kStreamCounts)
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(read_pass(threads, streams));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, bytes / s * 1e-9);
    }
  cache[threads] = best;
  return best;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0)), streams = static_cast<int>(state.range(1));
  const double bytes = static_cast<double>(read_buffer().data.size() * 8);
  read_pass(threads, streams);
  for (auto _ : state) benchmark::DoNotOptimize(read_pass(threads, streams));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) * 1e-9,
                                              benchmark::Counter::kIsRate);
}

// ---- matmul ------------------------------------------------------------------------------------------

struct WeightKey {
  DType dtype;
  int64_t n, k;
  bool hot;  // one copy, small enough to stay in cache: the kernel's compute rate
  bool operator<(const WeightKey& o) const {
    if (dtype != o.dtype) return dtype < o.dtype;
    if (n != o.n) return n < o.n;
    if (k != o.k) return k < o.k;
    return hot < o.hot;
  }
};

// Several copies of one random [n, k] weight, together larger than the last-level cache.
struct WeightSet {
  std::vector<unsigned char> bytes;   // copies x matrix bytes
  std::vector<unsigned char> scales;  // copies x scale bytes (FP8: fp32 [n/128, k/128])
  std::vector<Linear> copies;

  explicit WeightSet(const WeightKey& key) {
    const size_t elems = static_cast<size_t>(key.n * key.k);
    const size_t esize = dtype_size(key.dtype);
    const size_t mat = elems * esize;
    const int64_t srows = (key.n + 127) / 128, scols = (key.k + 127) / 128;
    const size_t sbytes = key.dtype == DType::F8_E4M3 ? static_cast<size_t>(srows * scols) * 4 : 0;
    const size_t ncopies = key.hot ? 1 : std::max<size_t>(2, (working_set_bytes() + mat - 1) / mat);
    bytes.resize(ncopies * mat);
    scales.resize(ncopies * sbytes);
    Rng rng{static_cast<uint64_t>(key.n * 131 + key.k)};
    unsigned char* first = bytes.data();
    for (size_t i = 0; i < elems; ++i) {
      switch (key.dtype) {
        case DType::F32: {
          const float f = rng.uniform() * 0.05f;
          std::memcpy(first + i * 4, &f, 4);
          break;
        }
        case DType::BF16: {
          const uint16_t h = f32_to_bf16(rng.uniform() * 0.05f);
          std::memcpy(first + i * 2, &h, 2);
          break;
        }
        case DType::F16: {  // random sign/mantissa, exponents around 2^-5
          const uint64_t r = rng.next();
          const uint16_t h = static_cast<uint16_t>((r & 0x83ffu) | ((8 + (r >> 16) % 4) << 10));
          std::memcpy(first + i * 2, &h, 2);
          break;
        }
        default: {  // F8_E4M3, no NaN codes
          uint8_t v = static_cast<uint8_t>(rng.next());
          if ((v & 0x7f) == 0x7f) v = 0x3f;
          first[i] = v;
          break;
        }
      }
    }
    for (size_t c = 1; c < ncopies; ++c) std::memcpy(bytes.data() + c * mat, first, mat);
    for (size_t i = 0; i < scales.size() / 4; ++i) {
      const float s = 0.001f + 0.0005f * static_cast<float>(i % 7);
      std::memcpy(scales.data() + i * 4, &s, 4);
    }
    for (size_t c = 0; c < ncopies; ++c) {
      Linear w;
      w.dtype = key.dtype;
      w.out = key.n;
      w.in = key.k;
      w.row_stride = key.k;
      w.data = bytes.data() + c * mat;
      if (key.dtype == DType::F8_E4M3) {
        w.scale = scales.data() + c * sbytes;
        w.scale_dtype = DType::F32;
        w.block_out = w.block_in = 128;
        w.scale_cols = scols;
      }
      copies.push_back(w);
    }
  }
};

// Holds one weight set at a time (benchmarks are registered grouped by weight).
const WeightSet& weight_set(const WeightKey& key) {
  static std::unique_ptr<WeightSet> cur;
  static WeightKey cur_key{DType::BOOL, 0, 0, false};
  if (!cur || cur_key < key || key < cur_key) {
    cur.reset();
    cur = std::make_unique<WeightSet>(key);
    cur_key = key;
  }
  return *cur;
}

void BM_Matmul(benchmark::State& state, DType dtype, int64_t n, int64_t k, bool hot) {
  const int64_t M = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const double read_bw = hot ? 0.0 : read_bandwidth_gbs(threads);
  const WeightSet& ws = weight_set(WeightKey{dtype, n, k, hot});
  ThreadPool* pool = pool_for(threads);
  // Activations at a 64-byte boundary plus NEXTN_BENCH_X_OFFSET floats (default 4: the 16-byte alignment
  // a std::vector typically gets).
  const char* off_env = std::getenv("NEXTN_BENCH_X_OFFSET");
  const size_t x_off = off_env ? static_cast<size_t>(std::atoi(off_env)) : 4;
  std::vector<float> xbuf(static_cast<size_t>(M * k) + 32), y(static_cast<size_t>(M * n));
  float* x = xbuf.data() + ((64 - reinterpret_cast<uintptr_t>(xbuf.data()) % 64) % 64) / 4 + x_off % 16;
  Rng rng{7};
  for (int64_t i = 0; i < M * k; ++i) x[i] = rng.uniform();
  const double bytes = static_cast<double>(ws.copies[0].weight_bytes());
  size_t c = 0;
  for (const Linear& w : ws.copies) ops::matmul(pool, x, M, w, y.data());  // warm-up: page faults
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    ops::matmul(pool, x, M, ws.copies[c], y.data());
    benchmark::DoNotOptimize(y.data());
    if (++c == ws.copies.size()) c = 0;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double iters = static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes * iters * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GMAC/s"] = benchmark::Counter(double(M * n * k) * iters * 1e-9, benchmark::Counter::kIsRate);
  if (!hot) {
    state.counters["read_GB/s"] = read_bw;
    state.counters["pct_read"] = secs > 0 ? 100.0 * (bytes * iters / secs * 1e-9) / read_bw : 0.0;
  }
}

// Cost of one hand-off to the pool: an empty parallel_for over all threads, back to back (workers spinning)
// or after `gap_us` of idleness on the calling thread (workers may have gone to sleep).
void BM_ParallelForHandoff(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const auto gap = std::chrono::microseconds(state.range(1));
  ThreadPool pool(threads);
  double total = 0.0;
  for (auto _ : state) {
    if (gap.count() > 0) {
      state.PauseTiming();
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < gap) {
      }
      state.ResumeTiming();
    }
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(threads, 1, [](int64_t, int64_t, int) {});
    total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["us_per_handoff"] = total / static_cast<double>(state.iterations());
}

void register_all() {
  const std::vector<int> threads = thread_counts();
  for (int t : threads)
    if (t > 1)
      benchmark::RegisterBenchmark("BM_ParallelForHandoff", BM_ParallelForHandoff)
          ->ArgsProduct({{t}, {0, 20, 100}})
          ->ArgNames({"threads", "gap_us"})
          ->Unit(benchmark::kMicrosecond);
  for (int t : threads)
    for (int streams : kStreamCounts)
      benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth)
          ->Args({t, streams})
          ->ArgNames({"threads", "streams"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  struct Shape {
    int64_t n, k;
  };
  struct Group {
    DType dtype;
    const char* name;
    std::vector<Shape> shapes;
    std::vector<int64_t> ms;
  };
  const std::vector<Group> groups = {
      {DType::BF16, "bf16", {{4096, 4096}, {2048, 8192}}, {1, 2, 4, 8, 16}},
      {DType::F8_E4M3, "fp8", {{4096, 4096}, {2048, 8192}}, {1, 2, 3, 4, 5, 6, 8, 16}},  // (verify: k + 1 rows)
      {DType::BF16, "bf16", {{4096, 4096}}, {64}},  // prefill-sized
      {DType::F8_E4M3, "fp8", {{4096, 4096}}, {64}},
      {DType::F8_E4M3, "fp8", {{768, 2048}, {2048, 768}}, {1, 4}},  // MoE expert gate/up and down (hidden 2048)
      // the dense MLP of `nextn bench --synthetic --mlp dense` (hidden 2048): gate/up, down
      {DType::F8_E4M3, "fp8", {{5632, 2048}, {2048, 5632}}, {1, 2, 3, 4}},
      {DType::BF16, "bf16", {{768, 2048}, {2048, 768}}, {1, 4}},
      {DType::F16, "f16", {{4096, 4096}}, {1, 4}},
      {DType::F32, "f32", {{4096, 4096}}, {1, 4}},
  };
  for (const Group& g : groups)
    for (const Shape& s : g.shapes) {
      std::vector<int64_t> tl(threads.begin(), threads.end());
      const std::string name =
          std::string("BM_Matmul/") + g.name + "/" + std::to_string(s.n) + "x" + std::to_string(s.k);
      benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, g.dtype, s.n, s.k, false)
          ->ArgsProduct({g.ms, tl})
          ->ArgNames({"M", "threads"})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  // Cache-resident weights (one thread): what the kernels compute per second when memory is not the limit.
  for (const Group& g : groups) {
    if (g.ms.size() == 1) continue;  // (the prefill-sized groups repeat a dtype)
    const int64_t n = 64, k = 4096;  // 256 KiB..1 MiB: fits L2
    const std::string name = std::string("BM_MatmulHot/") + g.name + "/" + std::to_string(n) + "x" + std::to_string(k);
    benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, g.dtype, n, k, true)
        ->ArgsProduct({{1, 2, 4, 8, 16}, {1}})
        ->ArgNames({"M", "threads"})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // The bundled models' narrow matrices (hidden 256; lm_head 2048 x 256 in bf16), cache-resident, one thread:
  // at these sizes a call's fixed costs (tiles' reductions, the k tail, dispatch) weigh as much as its
  // multiply-adds, and a verify's extra rows cost nearly what the first did.
  const std::vector<Group> small = {
      {DType::BF16, "bf16", {{2048, 256}, {16, 512}, {512, 16}, {2, 512}}, {1, 2, 4}},
      {DType::F8_E4M3, "fp8", {{512, 256}, {256, 256}, {256, 32}, {64, 256}}, {1, 2, 4}},
  };
  for (const Group& g : small)
    for (const Shape& s : g.shapes) {
      const std::string name =
          std::string("BM_MatmulSmall/") + g.name + "/" + std::to_string(s.n) + "x" + std::to_string(s.k);
      benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, g.dtype, s.n, s.k, true)
          ->ArgsProduct({g.ms, {1}})
          ->ArgNames({"M", "threads"})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace
}  // namespace nextn

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // NEXTN_BENCH_TARGET=AVX2 (or AVX3, SCALAR, ...): run the kernels of that Highway target instead of the
  // best one the CPU supports.
#ifdef NEXTN_BENCH_HWY
  if (const char* want = std::getenv("NEXTN_BENCH_TARGET")) {
    int64_t chosen = 0;
    for (int64_t bits = hwy::SupportedTargets(); bits != 0; bits &= bits - 1) {
      const int64_t t = bits & -bits;
      if (std::string(hwy::TargetName(t)) == want) chosen = t;
    }
    if (chosen == 0) {
      std::fprintf(stderr, "NEXTN_BENCH_TARGET=%s: not a target this CPU supports\n", want);
      return 1;
    }
    hwy::SetSupportedTargetsForTest(chosen);
  }
  benchmark::AddCustomContext("matmul_target", nextn::matmul_kernels::active_target_name());
#endif
  nextn::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
