// --device: where a command's model runs (commands.h).
#include "cli/args.h"
#include "cli/commands.h"
#include "core/threadpool.h"
#include "io/mapped_file.h"
#include "models/common/tensor_parallel.h"
#include "models/registry.h"
#include "ops/cuda/cuda_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace nextn::cli {

std::string device_option(const Args& a) {
  const std::string d = a.get("device", "auto");
  if (d != "cpu" && d != "cuda" && d != "auto") throw UsageError("--device must be cpu, cuda or auto, got '" + d + "'");
  return d;
}

void apply_weights_option(const Args& a) {
  if (!a.has("weights")) return;  // ($NEXTN_WEIGHTS, read at the first file opened)
  const std::string w = a.get("weights");
  if (w != "mapped" && w != "memory") throw UsageError("--weights must be mapped or memory, got '" + w + "'");
  set_file_residency(w == "memory" ? FileResidency::kInMemory : FileResidency::kMapped);
  ::setenv("NEXTN_WEIGHTS", w.c_str(), 1);  // (the rank processes inherit the environment)
}

DraftHeadKind draft_head_option(const Args& a) {
  try {
    return parse_draft_head(a.get("draft-head", "auto"), "--draft-head");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

std::unique_ptr<Model> load_command_model(const std::string& dir, ThreadPool& pool, int tensor_parallel) {
  if (tensor_parallel <= 1) return load_model(dir, &pool);
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw Error("--tensor-parallel: cannot find this executable to start the ranks (" + ec.message() + ")");
  std::vector<std::string> cmdline;  // (NUL-separated arguments)
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  for (std::string arg; std::getline(in, arg, '\0');) cmdline.push_back(arg);
  // (every rank its share of the threads asked for: `pool` stays idle)
  return load_tensor_parallel_processes(dir, tensor_parallel, rank_launcher(exe, cmdline),
                                        std::max(1, pool.size() / tensor_parallel));
}

int run_tensor_parallel_rank_command(int argc, char** argv) {
  const Args a(argc, argv, 2, {}, {"model", "group", "rank", "threads"});
  return run_tensor_parallel_rank(a.get("model"), a.get("group"), a.get_int("rank", 1, 1, 63),
                                  a.get_int("threads", 1, 1, max_threads()));
}

std::string place_model(Model& model, const std::string& option) {
  if (option == "cpu") return "cpu";
  std::string why;
  const bool gpu = cuda::available(&why);
  if (option == "auto" && (!gpu || !model.runs_on(Device::kCuda))) return "cpu";
  if (!gpu) throw Error("--device cuda: " + why);
  model.use_device(Device::kCuda);
  std::string where = "cuda: " + cuda::device_name();
  const std::string how = model.collectives();  // (tensor parallel: how the ranks' GPUs exchange rows)
  if (!how.empty()) where += ", tensor-parallel collectives " + how;
  return where;
}

void prepare_forwards(Model& model, int64_t rows, int64_t positions, bool quiet) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t shapes = model.prepare_forwards(rows, positions);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (shapes > 0 && !quiet)
    std::fprintf(stderr, "nextn: recorded %lld forward shapes (batches of up to %lld rows) in %.2f s\n",
                 static_cast<long long>(shapes), static_cast<long long>(rows), s);
}

}  // namespace nextn::cli
