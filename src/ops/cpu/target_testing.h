// Test helpers for the Highway kernels: the targets this CPU can run, and forcing one of them.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "hwy/targets.h"
#include "ops/cpu/matmul_kernels.h"

namespace nextn {

// The targets compiled into the kernels that this CPU can run, best first.
inline std::vector<int64_t> kernel_targets() {
  std::vector<int64_t> out;
  for (int64_t bits = hwy::SupportedTargets() & matmul_kernels::compiled_targets(); bits != 0; bits &= bits - 1)
    out.push_back(bits & -bits);
  return out;
}

// Forces one target for the scope (and checks the kernels really dispatch to it).
class ForceTarget {
 public:
  explicit ForceTarget(int64_t target) {
    hwy::SetSupportedTargetsForTest(target);
    EXPECT_STREQ(matmul_kernels::active_target_name(), hwy::TargetName(target));
  }
  ~ForceTarget() { hwy::SetSupportedTargetsForTest(0); }
  ForceTarget(const ForceTarget&) = delete;
  ForceTarget& operator=(const ForceTarget&) = delete;
};

}  // namespace nextn
