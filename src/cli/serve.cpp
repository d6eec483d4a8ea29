// `nextn serve`: loads the model, starts the engine thread and the HTTP server (src/serve), serves until
// SIGINT / SIGTERM, then drains. docs/server.md describes the API.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "models/registry.h"
#include "serve/chat_template/chat_template.h"
#include "serve/engine_service.h"
#include "serve/http_server.h"

namespace nextn::cli {
namespace {

const char* kServeUsage = R"(usage: nextn serve [--model DIR] [--host 127.0.0.1] [--port 8000] [options]

An OpenAI-compatible server (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health,
/metrics with vLLM's metric names, and a chat page at /). Requests from many clients are batched together
(continuous batching); each speculates with the checkpoint's own MTP layers: greedy output is exactly the
target's, sampled output is distributed as the target's. docs/server.md has the API.

  --model DIR               HuggingFace checkpoint folder (default: the bundled model)
  --host ADDR               address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)
  --port P                  port (default 8000; 0: any free port, printed when ready)
  --served-model-name NAME  the model id clients send and /v1/models lists (default: the folder's name)
  --chat-template FILE      a Jinja chat template instead of the checkpoint's own
  --speculative-tokens K    k for requests that do not set num_speculative_tokens, 1..8 (default:
                            generation_config.json's num_speculative_tokens, else 3); greedy requests tune
                            k in 0..K by measured speed unless K is given here
  --no-speculate            plain decoding unless a request asks for num_speculative_tokens
  --max-sequences N         sequences decoding at once (default 64; more wait in the queue)
  --max-queue N             requests waiting for a slot before new ones get 429 (default 256)
  --kv-cache-mb N           the KV cache pool all sequences share, in MiB (default 512)
  --max-body-kb N           largest request body, in KiB (default 8192; larger bodies get 413)
  --http-threads N          connections served at once (default 128; each stream holds one)
  --threads N               compute threads, 1 to 4x the cores (default, or 0: every CPU this process may use)
  --weights mapped|memory   the checkpoint's files mapped (default, or $NEXTN_WEIGHTS) or read into huge-page
                            memory at load: a private copy, slower to load, faster to stream on some CPUs
  --draft-head H            the lm_head of the draft steps: fp8, an FP8 block-quantized copy of a bf16
                            head (half the bytes a draft step reads; the output is the same); target, the
                            target's own; auto (default): fp8 for a head of 8 MiB or more
  --device cpu|cuda|auto    where the model runs (default auto: the GPU when there is one and the CUDA
                            backend runs the model's family; else the CPU)
  --tensor-parallel N       run the model as N tensor-parallel ranks (heads, MLP features, experts and
                            vocabulary split, docs/parallel.md); ranks 1.. are processes this command
                            starts; on the CPU a test of what several GPUs will run, no faster
)";

std::string model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "models/x/" -> "models/x"
  const std::string name = p.filename().string();
  return name.empty() ? "model" : name;
}

// The template: --chat-template FILE (with the checkpoint's special tokens), else the checkpoint's. None: the chat endpoint answers 400 with the reason.
std::optional<serve::ChatTemplate> chat_template(const Args& a, const std::string& dir) {
  if (!a.has("chat-template")) return serve::ChatTemplate::from_checkpoint(dir);
  return serve::ChatTemplate::from_file(a.get("chat-template"), dir);
}

}  // namespace

int run_serve(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "no-speculate"},
         {"model", "host", "port", "served-model-name", "chat-template", "speculative-tokens", "max-sequences",
          "max-queue", "kv-cache-mb", "max-body-kb", "http-threads", "threads", "device", "tensor-parallel",
          "weights", "draft-head"});
  if (a.has("help")) {
    std::fputs(kServeUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) throw UsageError("nextn serve: unexpected argument '" + a.positional()[0] + "'");
  apply_weights_option(a);
  const DraftHeadKind draft_head = draft_head_option(a);
  // Before any thread starts: the shutdown signals go to serve_http's sigwait, in every thread.
  serve::block_shutdown_signals();

  const std::string dir = a.get("model", default_model());
  serve::HttpOptions http;
  http.host = a.get("host", "127.0.0.1");
  http.port = a.get_int("port", 8000, 0, 65535);
  http.max_body_bytes = size_t(a.get_int("max-body-kb", 8192, 1, 1 << 20)) << 10;
  http.http_threads = a.get_int("http-threads", 128, 4, 4096);
  serve::ServiceOptions service_options;
  service_options.max_sequences = a.get_int("max-sequences", 64, 1, 4096);
  service_options.max_queue = a.get_int("max-queue", 256, 1, 1 << 20);
  MemoryOptions memory;
  memory.kv_cache_bytes = int64_t(a.get_int("kv-cache-mb", 512, 1, 1 << 30)) << 20;

  ThreadPool pool(thread_count(a));
  const std::unique_ptr<Model> model = load_command_model(dir, pool, tensor_parallel(a));
  model->prefault(/*progress=*/true);
  const std::string where = place_model(*model, device_option(a));
  model->use_draft_head(draft_head);
  model->configure_memory(memory);
  std::unique_ptr<Tokenizer> tok;
  if (std::filesystem::exists(dir + "/tokenizer.json")) tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
  const std::optional<serve::ChatTemplate> templ = chat_template(a, dir);
  if (!templ) std::fprintf(stderr, "nextn serve: %s has no chat template: /v1/chat/completions is off\n", dir.c_str());

  serve::ServedModel served;
  served.id = a.get("served-model-name", model_name(dir));
  served.facts = &model->facts();
  served.tokenizer = tok.get();
  if (tok) served.vocab = structured::TokenVocab::from_tokenizer(*tok, model->facts().vocab_size);
  served.chat_template = templ ? &*templ : nullptr;
  SpecOptions& spec = served.default_spec;
  spec.enabled = !a.has("no-speculate") && model->facts().num_mtp_layers > 0;
  const bool k_given = a.has("speculative-tokens");
  spec.num_speculative_tokens = k_given ? a.get_int("speculative-tokens", 3, 1, 8) : default_speculative_tokens(dir, true);
  spec.tune_k = !k_given;
  spec.validate();
  // Every decode shape of a full batch recorded now, not while the first users wait, for sequences of up to
  // 32k positions (the attention's scratch grows with rows x positions: a longer request grows it later, and
  // the shapes are then recorded again as they recur).
  const int k_max = spec.enabled ? spec.num_speculative_tokens : 0;
  constexpr int64_t kPreparedPositions = 32768;
  prepare_forwards(*model, int64_t(service_options.max_sequences) * forward_rows_per_sequence(k_max),
                   std::min<int64_t>(model->facts().context, kPreparedPositions), /*quiet=*/false);

  serve::Metrics metrics(served.id);
  serve::EngineService service(*model, tok.get(), metrics, service_options);
  std::fprintf(stderr, "nextn serve: %s (%s) on %s, CPU kernels %s, %d compute threads; %s\n", served.id.c_str(),
               model->facts().model_type.c_str(), where.c_str(), cpu_target_text().c_str(), pool.size(),
               model->memory_summary().c_str());
  return serve::serve_http(served, service, metrics, http);
}

}  // namespace nextn::cli
