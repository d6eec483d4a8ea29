// The host's work per sampled row at the vocabulary sizes of the bundled models (2048), the synthetic
// checkpoints (32000) and real ones (129280): the processed distribution (softmax at a temperature, top-k /
// top-p / min-p), one draw, and a token's logprob with its top alternatives. Every sampled target row and every
// sampled draft row of a speculative round pays the first; a request with logprobs pays the second per token.
//
//   ./build/bin/nextn_bench_kernels --benchmark_filter='Sampler|TokenLogprob'
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"

namespace nextn {
namespace {

// sd 3: a peaked row (a few hundred tokens hold top_p 0.9); sd 0.3: a nearly flat one, as a random model's
// (the nucleus is most of the vocabulary).
std::vector<float> gaussian_logits(int64_t V, float sd = 3.0f) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> logits(static_cast<size_t>(V));
  for (float& l : logits) l = normal(rng);
  return logits;
}

// range(1): 0 temperature alone, 1 top_p 0.9, 2 top_k 50, 3 top_p 0.95 with min_p 0.05, 4 top_p 0.9 of a flat row
void BM_SamplerDistribution(benchmark::State& state) {
  const int64_t V = state.range(0);
  const int64_t mode = state.range(1);
  const std::vector<float> logits = gaussian_logits(V, mode == 4 ? 0.3f : 3.0f);
  SamplingParams p;
  p.temperature = 0.8f;
  if (mode == 1 || mode == 4) p.top_p = 0.9f;
  if (mode == 2) p.top_k = 50;
  if (mode == 3) p.top_p = 0.95f, p.min_p = 0.05f;
  Sampler s(V, p);
  std::vector<float> probs(static_cast<size_t>(V));
  for (auto _ : state) {
    s.distribution(logits.data(), probs.data());
    benchmark::DoNotOptimize(s.sample(probs.data()));
  }
  const char* labels[] = {"temperature", "top_p 0.9", "top_k 50", "top_p+min_p", "top_p 0.9, flat row"};
  state.SetLabel(labels[mode]);
}
BENCHMARK(BM_SamplerDistribution)
    ->ArgsProduct({{2048, 32000, 129280}, {0, 1, 2, 3, 4}})
    ->ArgNames({"V", "mode"})
    ->Unit(benchmark::kMicrosecond);

void BM_TokenLogprob(benchmark::State& state) {
  const int64_t V = state.range(0);
  const std::vector<float> logits = gaussian_logits(V);
  for (auto _ : state) benchmark::DoNotOptimize(token_logprob(logits.data(), V, 7, int(state.range(1))));
}
BENCHMARK(BM_TokenLogprob)->ArgsProduct({{2048, 129280}, {0, 5}})->ArgNames({"V", "top"})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace nextn
