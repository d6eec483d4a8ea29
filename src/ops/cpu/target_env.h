// NEXTN_CPU_TARGET inside the CPU backend (ops/cpu_target.h is the public side): parsing a target name,
// forcing it before the first kernel call, and what tests need to give the forced target back.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace nextn::cpu_target {

// A parsed NEXTN_CPU_TARGET value: one Highway target bit, or 0 and why not.
struct Choice {
  int64_t target = 0;
  std::string error;  // e.g. "NEXTN_CPU_TARGET=avx512: this CPU cannot run AVX3; it can run: AVX2, EMU128"
};

// The target `name` denotes (case-insensitive: a Highway target name, or avx512 = AVX3, scalar = the
// scalar target in `compiled`), provided it is in `compiled` (the kernels' HWY_TARGETS) and in `runnable`
// (those of them this CPU can run).
Choice parse(std::string_view name, int64_t compiled, int64_t runnable);

// The Highway names of the targets in mask, best first, comma separated ("AVX2, EMU128").
std::string names(int64_t mask);

// Reads NEXTN_CPU_TARGET the first time it is called (every later call does nothing) and forces its
// target for the process, or prints "nextn: <error>" on stderr and exits with status 2. The kernel
// sources call it from a static initializer, so it runs before main.
void apply_env();

// The target NEXTN_CPU_TARGET forces (0: none). A test that forces another target gives this one back
// (hwy::SetSupportedTargetsForTest(forced())), not the CPU's best.
int64_t forced();

// The targets compiled into the kernels that this CPU can run, detected before anything was forced.
int64_t runnable();

}  // namespace nextn::cpu_target
