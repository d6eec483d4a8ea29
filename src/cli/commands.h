// Sub-commands of the `nextn` executable: main.cpp dispatches `nextn <command> ...` to them with its own
// argc/argv (argv[1] is the command name). Each returns the process exit status.
#pragma once

namespace nextn::cli {

// `nextn inspect DIR [--json]`: what the loader makes of a checkpoint (0: loadable, 1: not, 2: bad usage).
int run_inspect(int argc, char** argv);

// `nextn bench [--model DIR | --synthetic] [--json]`: bandwidth, decode, verify cost, speculation (src/cli/bench.cpp).
int run_bench(int argc, char** argv);

}  // namespace nextn::cli
