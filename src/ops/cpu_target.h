// Which SIMD target the CPU kernels run, and forcing one for the whole process.
//
// The kernels (ops/cpu/*_hwy.cpp) are compiled for several Highway targets and dispatch at run time to the
// best one this CPU can run. The environment variable NEXTN_CPU_TARGET, read once before the first kernel
// call of any program linking libnextn, makes every kernel of the process run one target instead: a
// Highway target name such as AVX3, AVX2 or EMU128, or the alias avx512 (= AVX3) or scalar (= the compiled
// scalar fallback, EMU128 or SCALAR), in any case. A name that is unknown, not compiled into this build or
// not runnable on this CPU stops the program before any kernel runs, with a message on stderr such as
//   nextn: NEXTN_CPU_TARGET=avx512: this CPU cannot run AVX3; it can run: AVX2, EMU128
// and exit status 2: a run never silently uses another target than the one asked for. Unset or empty:
// the best target.
#pragma once

namespace nextn::ops {

// The Highway target the CPU kernels dispatch to now ("AVX3", "AVX2", "EMU128", ...).
const char* cpu_target_name();
// Whether NEXTN_CPU_TARGET chose that target (otherwise it is the best one this CPU runs).
bool cpu_target_forced();
// How that target's decode-sized FP8 matmuls decode e4m3: "bits" or "f16" (the same results either way; the
// faster one on this CPU, measured at first use, unless NEXTN_FP8_DECODE=auto|f16|bits says: an unknown value
// stops the program as NEXTN_CPU_TARGET's do).
const char* cpu_fp8_decode_name();

}  // namespace nextn::ops
