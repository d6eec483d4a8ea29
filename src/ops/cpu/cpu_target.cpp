// NEXTN_CPU_TARGET: one Highway target for every kernel of the process (ops/cpu_target.h).
//
// Forcing uses hwy::SetSupportedTargetsForTest: the build's baseline is x86-64-v3, and Highway 1.0's
// DisableTargets never disables a baseline target, so it could not force the scalar fallback. That call
// trusts its argument (a target the CPU lacks would fault on its first instruction), hence the check
// against the targets detected before anything is forced.
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hwy/targets.h"
#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/target_env.h"
#include "ops/cpu_target.h"

namespace nextn {
namespace cpu_target {
namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// Target names of other Highway releases than the one this build uses: asked for, they are "not compiled
// into this build" rather than unknown.
constexpr std::string_view kOtherReleaseNames[] = {"SSE2", "AVX3_ZEN4", "AVX3_SPR", "AVX10_2", "AVX10_2_512"};

// The bit whose Highway name is `want` (upper case), 0 if none.
int64_t bit_named(const std::string& want) {
  for (int b = 0; b < 63; ++b) {
    const int64_t bit = int64_t(1) << b;
    const std::string_view name = hwy::TargetName(bit);
    if (name != "Unknown" && want == name) return bit;  // ("Unknown": a bit Highway has no target for)
  }
  return 0;
}

struct State {
  int64_t runnable = 0, forced = 0;
};

// Detected and applied once, on the first call (from the kernels' static initializers).
const State& state() {
  static const State s = [] {
    State st;
    const int64_t compiled = matmul_kernels::compiled_targets();
    st.runnable = hwy::SupportedTargets() & compiled;  // nothing is forced yet: the CPU's own targets
    const char* env = std::getenv("NEXTN_CPU_TARGET");
    if (env != nullptr && *env != '\0') {
      const Choice c = parse(env, compiled, st.runnable);
      if (c.target == 0) {
        std::fprintf(stderr, "nextn: %s\n", c.error.c_str());
        std::exit(2);
      }
      st.forced = c.target;
      hwy::SetSupportedTargetsForTest(c.target);
    }
    const char* fp8 = std::getenv("NEXTN_FP8_DECODE");
    if (fp8 != nullptr && *fp8 != '\0') {
      const std::string how = upper(fp8);
      if (how != "AUTO" && how != "F16" && how != "BITS") {
        std::fprintf(stderr, "nextn: NEXTN_FP8_DECODE=%s: unknown; use auto, f16 or bits\n", fp8);
        std::exit(2);
      }
      matmul_kernels::set_fp8_decode(how == "F16"    ? matmul_kernels::Fp8Decode::kF16
                                     : how == "BITS" ? matmul_kernels::Fp8Decode::kBits
                                                     : matmul_kernels::Fp8Decode::kAuto);
    }
    return st;
  }();
  return s;
}

}  // namespace

std::string names(int64_t mask) {
  std::string out;
  for (int64_t bits = mask; bits != 0; bits &= bits - 1) {  // lower bits are better targets
    if (!out.empty()) out += ", ";
    out += hwy::TargetName(bits & -bits);
  }
  return out.empty() ? "none" : out;
}

Choice parse(std::string_view name, int64_t compiled, int64_t runnable) {
  const std::string want = upper(name), what = "NEXTN_CPU_TARGET=" + std::string(name) + ": ";
  int64_t target = 0;
  if (want == "AVX512") {
    target = HWY_AVX3;
  } else if (want == "SCALAR") {  // whichever scalar fallback is compiled (Highway's SCALAR if neither)
    const int64_t scalar = compiled & (HWY_EMU128 | HWY_SCALAR);
    target = scalar != 0 ? (scalar & -scalar) : HWY_SCALAR;
  } else {
    target = bit_named(want);
  }
  if (target == 0) {
    for (std::string_view other : kOtherReleaseNames)
      if (want == other) return {0, what + want + " is not compiled into this build; it has: " + names(compiled)};
    return {0, what + "unknown target; this build has: " + names(compiled) + " (also: avx512, scalar)"};
  }
  const std::string target_name = hwy::TargetName(target);
  if ((target & compiled) == 0)
    return {0, what + target_name + " is not compiled into this build; it has: " + names(compiled)};
  if ((target & runnable) == 0)
    return {0, what + "this CPU cannot run " + target_name + "; it can run: " + names(runnable)};
  return {target, ""};
}

void apply_env() { state(); }
int64_t forced() { return state().forced; }
int64_t runnable() { return state().runnable; }

}  // namespace cpu_target

namespace matmul_kernels {
namespace {
std::atomic<int> g_fp8_decode{static_cast<int>(Fp8Decode::kAuto)};
}
void set_fp8_decode(Fp8Decode how) { g_fp8_decode.store(static_cast<int>(how), std::memory_order_relaxed); }
Fp8Decode fp8_decode_setting() { return static_cast<Fp8Decode>(g_fp8_decode.load(std::memory_order_relaxed)); }
}  // namespace matmul_kernels

namespace ops {

const char* cpu_fp8_decode_name() { return matmul_kernels::active_fp8_decode_name(); }
const char* cpu_target_name() { return matmul_kernels::active_target_name(); }
bool cpu_target_forced() { return cpu_target::forced() != 0; }

}  // namespace ops
}  // namespace nextn
