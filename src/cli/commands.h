// Sub-commands of the `nextn` executable: main.cpp dispatches `nextn <command> ...` to them with its own
// argc/argv (argv[1] is the command name). Each returns the process exit status.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "engine/request.h"
#include "engine/structured/matcher.h"
#include "io/tokenizer.h"
#include "models/model.h"

namespace nextn {
class ThreadPool;
}
#include "ops/cpu_target.h"

namespace nextn::cli {

// The SIMD target the CPU kernels run, as the commands print it: "AVX2", or "AVX2 (NEXTN_CPU_TARGET)" when forced.
inline std::string cpu_target_text() {
  return std::string(ops::cpu_target_name()) + (ops::cpu_target_forced() ? " (NEXTN_CPU_TARGET)" : "");
}

// --device cpu|cuda|auto as given (default auto); UsageError for anything else.
class Args;
std::string device_option(const Args& a);
// --weights mapped|memory as given (default: $NEXTN_WEIGHTS, else mapped): how the checkpoint's files are held
// (io/mapped_file.h), for this process and the tensor-parallel ranks it starts. UsageError for anything else.
void apply_weights_option(const Args& a);
// --draft-head auto|fp8|target as given (default auto): the lm_head the MTP draft steps use
// (models/common/draft_head.h).
// UsageError for anything else.
DraftHeadKind draft_head_option(const Args& a);
// Moves `model` to the device `option` names (auto: CUDA when a usable GPU is there and the model's family runs
// on it, else the CPU) before its first sequence; returns where it runs, for the logs ("cpu", "cuda: NVIDIA
// H200 (sm_90, 139 GiB)"). Throws nextn::Error when cuda is asked for and cannot be had, saying why.
std::string place_model(Model& model, const std::string& option);
// Model::prepare_forwards for batches of up to `rows` rows over sequences of up to `positions` positions (after
// configure_memory), saying on stderr what it prepared and in how long unless `quiet`.
void prepare_forwards(Model& model, int64_t rows, int64_t positions, bool quiet);
// DIR's model for a command: one, or with --tensor-parallel N that many ranks, ranks 1.. as processes of this
// executable (`nextn tensor-parallel-rank`, hidden) sharing pool's threads out among them.
std::unique_ptr<Model> load_command_model(const std::string& dir, ThreadPool& pool, int tensor_parallel);
// The hidden command a tensor-parallel rank process runs.
int run_tensor_parallel_rank_command(int argc, char** argv);

// `nextn inspect DIR [--json] [--scan]`: what the loader makes of a checkpoint (0: loadable, 1: not, 2: bad usage).
int run_inspect(int argc, char** argv);

// `nextn bench [--model DIR | --synthetic] [--json]`: bandwidth, decode, verify cost, speculation (src/cli/bench.cpp).
int run_bench(int argc, char** argv);

// `nextn serve [--model DIR] [--host H] [--port P] ...`: the OpenAI-compatible server (src/cli/serve.cpp, src/serve).
int run_serve(int argc, char** argv);

// The model commands use without --model: $NEXTN_MODEL, else the bundled models/nextn-hy4-tiny.
std::string default_model();

// k when none is given: generation_config.json's "num_speculative_tokens" (1..8), else 3. With
// warn_unusable, a file that cannot be used says so on stderr (generate); bench, which only measures, does not.
int default_speculative_tokens(const std::string& dir, bool warn_unusable);

// The "stats" object of `generate --json` (per request).
nlohmann::json stats_json(const SpecStats& s);

// What the command line sets for every request of `generate --requests` (a line's fields override it).
struct RequestDefaults {
  SamplingParams params;
  SpecOptions spec;
  bool ignore_eos = false;
  std::shared_ptr<const structured::Matcher> format;  // --json-object / --json-schema (null: free text)
};
// `nextn generate --requests FILE.jsonl` (src/cli/requests.cpp): exit status 0, or 1 when a request failed.
int run_requests(const std::string& path, const RequestDefaults& defaults, const std::string& model_dir,
                 const Tokenizer* tok, int threads, const MemoryOptions& memory, int max_sequences,
                 const std::string& device, int tensor_parallel, DraftHeadKind draft_head);

}  // namespace nextn::cli
