// Mixture-of-experts on the CPU, both families: each used expert (and a shared one) is a job of whole
// matrices, and the jobs, not the matrices, are spread over the threads. A small expert's three matmuls
// are too short to split (each hand-off would cost more than the split saves), and a verify's extra rows
// route to extra experts, which are then more jobs for the threads instead of more serial calls.
// Which thread runs a job never changes its values: the callers add the experts' outputs per token in
// ascending expert order afterwards.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/threadpool.h"
#include "ops/ops.h"

namespace nextn {

struct ExpertJob {
  int32_t expert = 0;           // routed expert id, or -1 for the shared expert (all S rows of x)
  int64_t first = 0, rows = 0;  // rows [first, first + rows) of the gathered tokens
  int64_t cost = 0;             // decode + multiply-add work: what balancing the threads goes by
};

// A SwiGLU expert's work over `rows` rows, in multiply-add units: its weights are decoded once whatever its
// rows (an e4m3 weight costs about four rows' multiply-adds to decode, a bf16 one about one), then each row
// multiplies them.
inline int64_t swiglu_job_cost(const Linear& gate, const Linear& up, const Linear& down, int64_t rows) {
  const int64_t decode = gate.dtype == DType::F8_E4M3 ? 4 : gate.dtype == DType::F32 ? 0 : 1;
  return (gate.out * gate.in + up.out * up.in + down.out * down.in) * (decode + rows);
}

// A SwiGLU MLP over `rows` rows of `in`: gate / up into a / b ([rows, gate.out] each), a <- swiglu(a, b) (up
// clamped to +-limit, gate capped at limit; no clamp when limit <= 0), then down into dst [rows, down.out].
// pool: the matmuls split over it (null: on the calling thread).
inline void swiglu_mlp(ThreadPool* pool, const Linear& gate, const Linear& up, const Linear& down, float limit,
                       const float* in, int64_t rows, float* a, float* b, float* dst) {
  const int64_t I = gate.out;
  const ops::MatmulOut gu[2] = {{&gate, a}, {&up, b}};
  ops::matmul_many(pool, in, rows, gu, 2);
  for (int64_t r = 0; r < rows; ++r) ops::swiglu(a + r * I, b + r * I, I, limit, a + r * I);
  ops::matmul(pool, a, rows, down, dst);
}

// Runs jobs [0, n) (n <= kMaxExpertJobs) on the pool's threads in one hand-off: whole jobs, longest first onto
// the least-loaded thread (deterministic). run(const ExpertJob&, int thread) gets the running thread's index
// for its scratch.
inline constexpr int64_t kMaxExpertJobs = 1025;  // 1024 routed experts and a shared one
template <class Run>
void run_expert_jobs(ThreadPool& pool, const ExpertJob* jobs, int64_t n, const Run& run) {
  const int threads = std::min<int>(pool.size(), static_cast<int>(kMaxExpertJobs));
  int32_t by_cost[kMaxExpertJobs], owner[kMaxExpertJobs];
  int64_t load[kMaxExpertJobs] = {};
  for (int64_t j = 0; j < n; ++j) by_cost[j] = static_cast<int32_t>(j);
  std::sort(by_cost, by_cost + n, [&](int32_t p, int32_t q) {
    return jobs[p].cost != jobs[q].cost ? jobs[p].cost > jobs[q].cost : p < q;
  });
  for (int64_t i = 0; i < n; ++i) {
    const int32_t j = by_cost[i];
    owner[j] = static_cast<int32_t>(std::min_element(load, load + threads) - load);
    load[owner[j]] += jobs[j].cost;
  }
  pool.parallel_for(threads, 1, [&](int64_t t0, int64_t t1, int tid) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t j = 0; j < n; ++j)
        if (owner[j] == t) run(jobs[j], tid);
  });
}

}  // namespace nextn
