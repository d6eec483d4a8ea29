// Sub-commands of the `nextn` executable: main.cpp dispatches `nextn <command> ...` to them with its own
// argc/argv (argv[1] is the command name). Each returns the process exit status.
#pragma once
#include <string>

#include "ops/cpu_target.h"

namespace nextn::cli {

// The SIMD target the CPU kernels run, as the commands print it: "AVX2", or "AVX2 (NEXTN_CPU_TARGET)" when forced.
inline std::string cpu_target_text() {
  return std::string(ops::cpu_target_name()) + (ops::cpu_target_forced() ? " (NEXTN_CPU_TARGET)" : "");
}

// `nextn inspect DIR [--json] [--scan]`: what the loader makes of a checkpoint (0: loadable, 1: not, 2: bad usage).
int run_inspect(int argc, char** argv);

// `nextn bench [--model DIR | --synthetic] [--json]`: bandwidth, decode, verify cost, speculation (src/cli/bench.cpp).
int run_bench(int argc, char** argv);

}  // namespace nextn::cli
