// Opening a safetensors file with many tensors (MoE checkpoints with split experts carry ~100k): the
// header parse and its checks (duplicate names, overlapping ranges, offsets inside the file) must grow as
// n log n, not n². The time per open is the number to read; doubling n should a little more than double it.
//
//   ./build/bin/nextn_bench_kernels --benchmark_filter=Safetensors
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "io/safetensors.h"

namespace nextn {
namespace {

// A file of n one-float F32 tensors, stored in an order other than their name order.
std::string write_many_tensors(size_t n) {
  std::string h = "{";
  h.reserve(n * 64);
  for (size_t i = 0; i < n; ++i) {
    char name[80];
    std::snprintf(name, sizeof name, "model.layers.%zu.mlp.experts.%zu.weight", i / 256, i % 256);
    const uint64_t begin = (i * 7919) % n * 4;
    if (i) h += ',';
    h += std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(begin) +
         "," + std::to_string(begin + 4) + "]}";
  }
  h += "}";
  const std::string path = "/tmp/nextn_bench_many_" + std::to_string(::getpid()) + "_" + std::to_string(n) +
                           ".safetensors";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t len = h.size();
  f.write(reinterpret_cast<const char*>(&len), 8);  // little-endian on the machines we build for
  f << h << std::string(n * 4, '\0');
  return path;
}

void BM_SafetensorsOpenManyTensors(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::string path = write_many_tensors(n);
  for (auto _ : state) {
    SafetensorsFile f(path);
    benchmark::DoNotOptimize(f.tensors().data());
  }
  std::remove(path.c_str());
  state.counters["tensors_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SafetensorsOpenManyTensors)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(300'000)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace nextn
