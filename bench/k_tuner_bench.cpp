// How close tuned k (KTuner) gets to the best fixed k, on the synthetic machines and texts of
// spec/k_tuner_sim.h (shapes measured on the bundled model): not a speed benchmark, a quality one whose
// numbers are the counters.
//
//   ./build/bin/nextn_bench_kernels --benchmark_filter=KTuner
//
// Counters: regret_pct  100 · (time per token with the tuner / with the best fixed k - 1), mean of 200
//                       seeded generations of `tokens` tokens, round times jittered by ±5%;
//           best_k      the best fixed k of the scenario (k_max 4).
#include <benchmark/benchmark.h>

#include "engine/k_tuner_sim.h"

namespace nextn {
namespace {

void BM_KTunerRegret(benchmark::State& state) {
  const auto& s = ktuner_sim::scenarios()[static_cast<size_t>(state.range(0))];
  const int tokens = static_cast<int>(state.range(1));
  double r = 0;
  for (auto _ : state) benchmark::DoNotOptimize(r = ktuner_sim::regret(s, 4, tokens, 200, 0.05));
  state.counters["regret_pct"] = 100.0 * r;
  state.counters["best_k"] = ktuner_sim::best_fixed_k(s, 4);
  state.SetLabel(s.name);
}

void KTunerArgs(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < static_cast<int64_t>(ktuner_sim::scenarios().size()); ++i)
    for (int64_t tokens : {128, 400, 2000}) b->Args({i, tokens});
  b->ArgNames({"scenario", "tokens"})->Iterations(1)->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_KTunerRegret)->Apply(KTunerArgs);

}  // namespace
}  // namespace nextn
