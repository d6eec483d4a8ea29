// `nextn inspect DIR [--json] [--scan]`: prints what loading the checkpoint in DIR involves (architecture, sizes,
// layer kinds, quantization, MTP layers, tensor naming) and every warning or error the loader would give.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "models/registry.h"

namespace nextn::cli {

namespace {

const char kUsage[] =
    "usage: nextn inspect DIR [--json] [--scan]\n"
    "\n"
    "Describes the checkpoint in DIR (config.json + *.safetensors) without loading it: architecture,\n"
    "sizes (parameters, bytes by dtype), layer kinds, quantization, MTP layers (naming, mtp_quant_algo),\n"
    "tensor-name form, and the warnings and errors loading it would give.\n"
    "\n"
    "  --json     print one JSON object instead of text\n"
    "  --scan     also read every value and name each tensor holding NaN or inf (reads the whole checkpoint;\n"
    "             such a checkpoint is reported as not loadable)\n"
    "  -h, --help print this help\n"
    "\n"
    "Exit status: 0 when the checkpoint loads, 1 when loading would fail, 2 on bad arguments.\n";

}  // namespace

int run_inspect(int argc, char** argv) {
  std::string dir;
  bool json = false, scan = false;
  // argv as main() received it: argv[1] is the command name (tolerated absent).
  const int first = argc > 1 && std::strcmp(argv[1], "inspect") == 0 ? 2 : 1;
  for (int i = first; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (std::strcmp(a, "--json") == 0) {
      json = true;
    } else if (std::strcmp(a, "--scan") == 0) {
      scan = true;
    } else if (a[0] == '-' && a[1] != '\0') {
      std::fprintf(stderr, "nextn inspect: unknown option '%s'\n%s", a, kUsage);
      return 2;
    } else if (dir.empty()) {
      dir = a;
    } else {
      std::fprintf(stderr, "nextn inspect: unexpected argument '%s'\n%s", a, kUsage);
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "nextn inspect: missing DIR\n%s", kUsage);
    return 2;
  }
  const CheckpointReport info = inspect_model(dir, scan);
  if (json) {
    nlohmann::json j = info.json;
    j["cpu_target"] = ops::cpu_target_name();
    j["cpu_target_forced"] = ops::cpu_target_forced();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fputs(info.text.c_str(), stdout);
    std::printf("CPU kernels:   %s\n", cpu_target_text().c_str());
  }
  return info.loadable ? 0 : 1;
}

}  // namespace nextn::cli
