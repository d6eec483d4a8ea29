// Test helpers for the Highway kernels: the targets this CPU can run, and forcing one of them.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "hwy/targets.h"
#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/target_env.h"

namespace nextn {

// The targets compiled into the kernels that this CPU can run, best first; only NEXTN_CPU_TARGET's when it
// forces one (a run asked for one target tests that one).
inline std::vector<int64_t> kernel_targets() {
  std::vector<int64_t> out;
  const int64_t mask = cpu_target::forced() != 0 ? cpu_target::forced() : cpu_target::runnable();
  for (int64_t bits = mask; bits != 0; bits &= bits - 1) out.push_back(bits & -bits);
  return out;
}

// Forces one target for the scope (and checks the kernels really dispatch to it). The destructor gives
// back the process-wide choice: NEXTN_CPU_TARGET's target if it forced one, else the CPU's best.
class ForceTarget {
 public:
  explicit ForceTarget(int64_t target) {
    hwy::SetSupportedTargetsForTest(target);
    EXPECT_STREQ(matmul_kernels::active_target_name(), hwy::TargetName(target));
  }
  ~ForceTarget() { hwy::SetSupportedTargetsForTest(cpu_target::forced()); }
  ForceTarget(const ForceTarget&) = delete;
  ForceTarget& operator=(const ForceTarget&) = delete;
};

}  // namespace nextn
