// nextn command-line front-end.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threadpool.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "core/finite.h"
#include "models/registry.h"
#include "engine/generator.h"
#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_filter.h"
#include "engine/text_stream.h"

namespace nextn::cli {

nlohmann::json stats_json(const SpecStats& s) {
  return {{"num_drafts", s.num_drafts},
          {"num_draft_tokens", s.num_draft_tokens},
          {"num_accepted_tokens", s.num_accepted_tokens},
          {"per_position_acceptance", s.per_position_acceptance()},
          {"mean_acceptance_length", s.mean_acceptance_length()},
          {"tokens_per_second", s.tokens_per_second()},
          {"num_generated", s.num_generated},
          {"prompt_tokens", s.prompt_tokens},
          {"target_forwards", s.target_forwards},
          {"prefill_seconds", s.prefill_seconds},
          {"decode_seconds", s.decode_seconds},
          {"verify_seconds", s.verify_seconds},
          {"catch_up_seconds", s.catch_up_seconds},
          {"draft_seconds", s.draft_seconds},
          {"rounds_at_k", s.rounds_at_k},
          {"cpu_target", ops::cpu_target_name()},
          {"cpu_target_forced", ops::cpu_target_forced()}};
}

// k when --speculative-tokens is not given: generation_config.json's "num_speculative_tokens", else 3.
// A file that cannot be used is not fatal (generation does not need it); with `warn` it is said on stderr.
int default_speculative_tokens(const std::string& dir, bool warn_unusable) {
  const std::string path = dir + "/generation_config.json";
  std::ifstream f(path);
  if (!f) return 3;
  auto warn = [&](const std::string& why) {
    if (warn_unusable)
      std::fprintf(stderr, "nextn: warning: %s: %s; using num_speculative_tokens 3\n", path.c_str(), why.c_str());
    return 3;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    return warn(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return warn("not a JSON object");
  const auto it = j.find("num_speculative_tokens");
  if (it == j.end()) return 3;
  if (!it->is_number_integer()) return warn("num_speculative_tokens is " + it->dump() + ", not an integer");
  const int64_t k = it->get<int64_t>();  // (an unsigned value past int64 reads as negative: out of range too)
  if (k < 1 || k > 8) return warn("num_speculative_tokens " + it->dump() + " is outside 1..8");
  return static_cast<int>(k);
}

std::string default_model() {
  if (const char* env = std::getenv("NEXTN_MODEL"); env && *env) return env;
  return NEXTN_DEFAULT_MODEL;
}

namespace {

const char* kMainUsage = R"(nextn: HY V4 and Qwen4-Exp inference with native MTP speculative decoding.

usage: nextn <command> [options]

commands:
  generate     generate text (greedy or sampled), speculating with the checkpoint's MTP layers
  logits       write the logits of a prompt (and of the MTP draft layer) to a safetensors file
  inspect      describe a checkpoint folder: architecture, quantization, MTP layers, problems
  bench        measure bandwidth, decode speed, verify cost and speculative speedup
  serve        an OpenAI-compatible HTTP server (completions, chat, streaming, /metrics, a chat page at /)
  tokenize     print the token ids of a text as a JSON array
  detokenize   print the text of token ids

Without --model, commands use the bundled model (models/nextn-hy4-tiny) or $NEXTN_MODEL.
NEXTN_CPU_TARGET=avx512|avx2|scalar (or any Highway target name) forces the SIMD target of the kernels.

Run `nextn <command> --help` for the options of a command.
)";

const char* kGenerateUsage = R"(usage: nextn generate [--model DIR] [--prompt TEXT | --ids 1,2,3] [options]

Generates after the prompt (text from --prompt or standard input, or token ids) and streams the text to
stdout; acceptance metrics and tokens/s go to stderr. Speculative decoding with the checkpoint's own MTP
layers is on by default when the checkpoint has them: greedy output is identical to the target's,
sampled output is distributed exactly as the target's.

  --model DIR               HuggingFace checkpoint folder (default: the bundled model)
  --prompt TEXT             prompt text (default: read standard input)
  --ids LIST                prompt token ids instead of text, comma separated
  -n, --max-tokens N        tokens to generate (default 64)
  --json                    print {"ids": [...], "text": "...", "stats": {...}} on stdout
  --speculative-tokens K    draft K tokens per step, 1..8 (default: generation_config.json's
                            num_speculative_tokens, else 3)
  --speculative-tokens auto greedy: each step drafts the k in 0..K (K as above) that has been fastest
                            on this machine so far, measured as it runs (the output is the same for
                            every k). This is the default for greedy decoding without K or --adaptive;
                            sampling keeps k = K fixed, so that --seed reproduces its output.
  --no-speculate            plain decoding
  --draft-head H            the lm_head of the draft steps: fp8, an FP8 block-quantized copy of a bf16
                            head (half the bytes a draft step reads; the output is the same); target, the
                            target's own; auto (default): fp8 for a head of 8 MiB or more
  --no-draft-probs          verify as if the draft were one-hot (exact, lower acceptance; for comparison)
  --temperature T           0 = greedy (default 0); tiny values act as their limit, greedy
  --top-k K, --top-p P, --min-p P, --seed S
  --repetition-penalty R, --presence-penalty P, --frequency-penalty F
  --stop TEXT               stop before this text (repeatable; not included in the output)
  --logprobs N              with --json: each token's logprob under the target and its N best alternatives
  --json-object             the output is one JSON object (as OpenAI's response_format json_object)
  --json-schema FILE        the output is JSON valid against the JSON Schema in FILE (properties in its order;
                            a keyword that cannot be enforced is an error); exact under speculation. With
                            --requests: the default of every line (a line's "response_format" overrides it)
  --stop-id ID              stop after this token id (repeatable)
  --min-tokens N            no eos / stop id before N tokens, and stop texts only from the N-th on (vLLM's)
  --ignore-eos              do not stop at the checkpoint's eos token
  --relaxed-acceptance N,D  LOSSY: also accept drafts in the target's top-N within D of its top probability
  --adaptive THRESHOLD      shrink k while the rolling acceptance rate is under THRESHOLD (probe later)
  --threads N               worker threads, 1 to 4x the cores (default, or 0: every CPU this process may use)
  --weights mapped|memory   the checkpoint's files mapped (default, or $NEXTN_WEIGHTS) or read into huge-page
                            memory at load: a private copy, slower to load, faster to stream on some CPUs
  --device cpu|cuda|auto    where the model runs (default auto: the GPU when there is one and the CUDA
                            backend runs the model's family; else the CPU)
  --tensor-parallel N       run the model as N tensor-parallel ranks (heads, MLP features, experts and
                            vocabulary split, docs/parallel.md); ranks 1.. are processes this command
                            starts; on the CPU a test of what several GPUs will run, no faster
  --requests FILE.jsonl     run many requests at once (continuous batching): one JSON object a line with
                            "ids" or "prompt" and optionally max_tokens, temperature, top_k, top_p, min_p,
                            seed, speculative_tokens (0: plain), ignore_eos, stop, logprobs, response_format,
                            logit_bias, min_tokens (as OpenAI's and vLLM's; the options above are the
                            defaults); prints one JSON line per request, in input order,
                            as --json does ({"line": N, "error": ...} for a request that failed)
  --kv-cache-mb N           the KV cache pool all sequences share, in MiB (default: one sequence of the
                            whole context); a request that does not fit waits for pages, one larger than
                            the pool is refused
  --max-sequences N         sequences decoding at once with --requests (default 256)
)";

const char* kTokenizeUsage = R"(usage: nextn tokenize [--model DIR | --tokenizer FILE] --text TEXT
       nextn detokenize [--model DIR | --tokenizer FILE] --ids 1,2,3

tokenize prints the ids of TEXT as a JSON array (special tokens in the text are recognized; no bos is
added); detokenize prints the text of the ids.
)";

const char* kLogitsUsage = R"(usage: nextn logits --model DIR --ids 1,2,3 --output FILE.safetensors [--draft]

Writes tensor `logits` (F32, [T, V]) for the prompt. With --draft also `draft_logits` (F32, [T-1, V]):
MTP layer 0 over the prompt, position p fed token p+1 and the target's hidden state at p.

  --model DIR     checkpoint folder
  --ids LIST      prompt token ids, comma separated
  --output FILE   output .safetensors path
  --draft         also write draft_logits
  --threads N     worker threads, 1 to 4x the cores (default, or 0: every CPU this process may use)
  --weights W     mapped (default, or $NEXTN_WEIGHTS) or memory: the files read into huge-page memory at load
  --device D      cpu, cuda or auto (default: the GPU when there is one and it runs the model's family)
  --tensor-parallel N  as N tensor-parallel ranks, processes of this command (docs/parallel.md)
)";

// A bad command line: the message, then where the options are (the whole usage would bury the message).
[[noreturn]] void usage_exit(const std::string& command, const std::string& msg) {
  std::fprintf(stderr, "nextn: %s\n(`nextn %s --help` lists the options)\n", msg.c_str(), command.c_str());
  std::exit(2);
}

void print_stats(const SpecStats& s, bool speculated, int threads) {
  std::fprintf(stderr,
               "generated %lld tokens: prefill %lld tokens %.3f s, decode %.1f tokens/s, %lld target forwards (CPU "
               "kernels %s, %d thread%s)\n",
               (long long)s.num_generated, (long long)s.prompt_tokens, s.prefill_seconds, s.tokens_per_second(),
               (long long)s.target_forwards, cpu_target_text().c_str(), threads, threads == 1 ? "" : "s");
  // NEXTN_PROFILE=1: forward time by section, prefill included
  if (profile::enabled()) profile::report(stderr, "generated token", double(s.num_generated));
  if (!speculated) return;
  std::fprintf(stderr, "speculation: %lld drafts, %lld draft tokens, %lld accepted, mean acceptance length %.3f\n",
               (long long)s.num_drafts, (long long)s.num_draft_tokens, (long long)s.num_accepted_tokens,
               s.mean_acceptance_length());
  std::fprintf(stderr, "per-position acceptance:");
  for (double a : s.per_position_acceptance()) std::fprintf(stderr, " %.3f", a);
  std::fprintf(stderr, "\n");
  if (const std::string w = broken_drafts_warning(s.num_draft_tokens, s.num_accepted_tokens); !w.empty())
    std::fprintf(stderr, "%s\n", w.c_str());
  int64_t steps = 0;
  for (int64_t n : s.rounds_at_k) steps += n;
  if (steps > 0) {  // (tuned k, and a decode step or more: a single token is all prefill)
    std::fprintf(stderr, "steps per k (k tuned by measured speed; 0 = plain):%s\n", s.rounds_at_k_text().c_str());
    if (s.rounds_at_k[0] == steps)  // (the tuner's horizon: a probe would cost more than its share)
      std::fprintf(stderr,
                   "  (plain decoding for all %lld steps: a generation this short cannot pay for measuring whether "
                   "drafting is faster here, so the tuner did not try; --speculative-tokens K drafts anyway)\n",
                   (long long)steps);
    else if (2 * s.rounds_at_k[0] > steps)
      std::fprintf(stderr,
                   "  (plain decoding for %lld of %lld steps: drafting measured no faster than it on this machine and "
                   "model, so the tuner kept it off; the text is the same either way)\n",
                   (long long)s.rounds_at_k[0], (long long)steps);
  }
  if (s.decode_seconds > 0 && s.num_generated > 1)
    std::fprintf(stderr, "decode time: %s\n", s.round_split_text().c_str());
}


bool has_tokenizer(const std::string& dir) { return std::filesystem::exists(dir + "/tokenizer.json"); }

// --json-object: any JSON object; --json-schema FILE: the schema in FILE (its key order kept).
structured::Grammar output_grammar(const Args& a) {
  if (!a.has("json-schema")) return structured::Grammar::any_object();
  const std::string path = a.get("json-schema");
  std::ifstream f(path);
  if (!f) throw UsageError("--json-schema: cannot read " + path);
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--json-schema: " + path + " is not JSON: " + e.what());
  }
  try {
    return structured::Grammar::from_schema(schema, path);
  } catch (const Error& e) {
    throw UsageError(std::string("--json-schema: ") + e.what());
  }
}

int run_generate(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "json", "no-speculate", "no-draft-probs", "ignore-eos", "json-object"},
         {"model", "ids", "prompt", "max-tokens", "json-schema",
          "speculative-tokens", "temperature", "top-k", "top-p", "min-p",
          "seed", "repetition-penalty", "presence-penalty", "frequency-penalty", "stop", "stop-id", "min-tokens",
          "relaxed-acceptance", "adaptive", "threads", "logprobs", "requests", "kv-cache-mb", "max-sequences",
          "device", "tensor-parallel", "weights", "draft-head"});
  if (a.has("help")) {
    std::fputs(kGenerateUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
  apply_weights_option(a);
  const DraftHeadKind draft_head = draft_head_option(a);
  if (a.has("ids") && a.has("prompt")) throw UsageError("give either --prompt or --ids, not both");
  SamplingParams sp;
  sp.max_tokens = a.get_int("max-tokens", 64, 0, INT32_MAX);
  sp.temperature = static_cast<float>(a.get_double("temperature", 0.0, {0}));
  sp.top_k = a.get_int("top-k", 0, 0, INT32_MAX);
  sp.top_p = static_cast<float>(a.get_double("top-p", 1.0, {0, 1, /*lo_open=*/true}));
  sp.min_p = static_cast<float>(a.get_double("min-p", 0.0, {0, 1}));
  sp.seed = a.get_uint64("seed", 0);
  sp.repetition_penalty = static_cast<float>(a.get_double("repetition-penalty", 1.0, {0, RealRange{0}.hi, true}));
  sp.presence_penalty = static_cast<float>(a.get_double("presence-penalty", 0.0, {-2, 2}));
  sp.frequency_penalty = static_cast<float>(a.get_double("frequency-penalty", 0.0, {-2, 2}));
  sp.stop = a.all("stop");
  sp.logprobs = a.get_int("logprobs", -1, 0, 20);
  sp.min_tokens = a.get_int("min-tokens", 0, 0, INT32_MAX);
  if (sp.min_tokens > sp.max_tokens)
    throw UsageError("--min-tokens " + std::to_string(sp.min_tokens) + " is more than --max-tokens " +
                     std::to_string(sp.max_tokens));
  for (const auto& s : sp.stop)
    if (s.empty()) throw UsageError("--stop needs a non-empty text");
  for (const auto& s : a.all("stop-id")) {
    auto ids = parse_id_list(s, "--stop-id");
    sp.stop_token_ids.insert(sp.stop_token_ids.end(), ids.begin(), ids.end());
  }
  try {
    sp.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  SpecOptions so;
  so.enabled = !a.has("no-speculate");
  const bool k_auto = a.has("speculative-tokens") && a.get("speculative-tokens") == "auto";
  const bool k_given = a.has("speculative-tokens") && !k_auto;
  so.num_speculative_tokens = k_given ? a.get_int("speculative-tokens", 3, 1, 8) : 3;
  so.use_draft_probs = !a.has("no-draft-probs");
  if (a.has("relaxed-acceptance")) {
    const std::string v = a.get("relaxed-acceptance");
    const auto comma = v.find(',');
    if (comma == std::string::npos) throw UsageError("--relaxed-acceptance expects N,DELTA (e.g. 3,0.1)");
    so.relaxed = true;
    so.relaxed_top_n = static_cast<int>(parse_int(v.substr(0, comma), "--relaxed-acceptance N", 1, INT32_MAX));
    so.relaxed_delta = static_cast<float>(parse_double(v.substr(comma + 1), "--relaxed-acceptance DELTA", {0, 1}));
  }
  if (a.has("adaptive")) {
    if (k_auto) throw UsageError("--speculative-tokens auto and --adaptive are alternatives: give one");
    so.adaptive = true;
    so.adaptive_threshold = static_cast<float>(a.get_double("adaptive", 0.3, {0, 1}));
  }
  so.tune_k = !k_given && !so.adaptive;  // applies to greedy decoding only
  try {
    so.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }

  const std::string model_dir = a.get("model", default_model());
  require_checkpoint_folder(model_dir);
  if (!k_given) so.num_speculative_tokens = default_speculative_tokens(model_dir, /*warn_unusable=*/true);
  std::unique_ptr<Tokenizer> tok;
  if (has_tokenizer(model_dir)) tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(model_dir));
  MemoryOptions memory;
  memory.kv_cache_bytes = int64_t(a.get_int("kv-cache-mb", 0, 0, 1 << 30)) << 20;
  if (a.has("json-object") && a.has("json-schema")) throw UsageError("give --json-object or --json-schema, not both");
  const bool structured_output = a.has("json-object") || a.has("json-schema");
  if (structured_output && !tok) throw UsageError("--json-object / --json-schema need the model's tokenizer.json");
  // (compiled before the model loads: a schema error is said at once)
  const std::shared_ptr<const structured::Matcher> matcher =
      !structured_output ? nullptr : std::make_shared<const structured::Matcher>(output_grammar(a));
  if (a.has("requests")) {
    if (a.has("ids") || a.has("prompt")) throw UsageError("--requests takes the prompts from its file: drop --ids/--prompt");
    RequestDefaults d{sp, so, a.has("ignore-eos"), matcher};
    return run_requests(a.get("requests"), d, model_dir, tok.get(), thread_count(a), memory,
                        a.get_int("max-sequences", 256, 1, 1 << 20), device_option(a), tensor_parallel(a),
                        draft_head);
  }
  std::vector<int32_t> prompt;
  if (a.has("ids")) {
    prompt = parse_id_list(a.get("ids"), "--ids");
  } else {
    if (!tok) throw UsageError(model_dir + " has no tokenizer.json: give the prompt as --ids");
    std::string text = a.get("prompt");
    if (!a.has("prompt")) {
      std::ostringstream ss;
      ss << std::cin.rdbuf();
      text = ss.str();
      if (text.empty()) throw UsageError("no prompt: give --prompt TEXT, --ids, or text on standard input");
    }
    prompt = tok->encode(text, /*add_special=*/true);
  }
  if (!sp.stop.empty() && !tok) throw UsageError("--stop needs a tokenizer (the model has no tokenizer.json)");
  // The text side: streaming detokenization and stop strings (checked here, before the model loads).
  TextStream stream = [&] {
    try {
      return TextStream(tok.get(), sp.stop, sp.min_tokens);
    } catch (const Error& e) {
      throw UsageError(std::string("--stop: ") + e.what());
    }
  }();

  ThreadPool pool(thread_count(a));
  const std::unique_ptr<Model> loaded = load_command_model(model_dir, pool, tensor_parallel(a));
  Model& model = *loaded;
  model.prefault(/*progress=*/true);
  const std::string where = place_model(model, device_option(a));
  if (where != "cpu") std::fprintf(stderr, "nextn: the model runs on %s\n", where.c_str());
  if (so.enabled) model.use_draft_head(draft_head);
  // A recurrent-state model keeps one state per verify row: as many as this run's k needs, no more.
  memory.max_verify_rows = so.enabled ? so.num_speculative_tokens + 1 : 1;
  model.configure_memory(memory);
  if (!a.has("ignore-eos"))
    for (int32_t e : model.facts().eos_token_ids) sp.stop_token_ids.push_back(e);
  const bool json = a.has("json");

  // Streams the text as it becomes safe to show (no partial stop string, no partial character).
  auto show = [&](const std::string& piece) {
    if (piece.empty() || json) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  OutputFormat format;
  if (matcher) format = {matcher, structured::TokenVocab::from_tokenizer(*tok, model.facts().vocab_size)};
  Generator gen(model);
  auto res = gen.generate(prompt, sp, so, [&](int32_t t) {
    if (!stream.has_tokenizer()) {
      if (!json) {
        std::printf("%d ", t);
        std::fflush(stdout);
      }
      return true;
    }
    const TextStream::Delta d = stream.push(t);
    show(d.text);
    return !d.stopped;
  }, format);
  show(stream.finish());
  const bool speculated = so.enabled && model.facts().num_mtp_layers > 0;
  if (json) {
    nlohmann::json out = {{"ids", res.ids}, {"finish_reason", res.finish_reason}, {"stats", stats_json(res.stats)}};
    if (stream.has_tokenizer()) out["text"] = stream.text();
    if (sp.logprobs >= 0) out["logprobs"] = logprobs_json(res.logprobs);
    std::cout << out.dump() << std::endl;
  } else {
    std::printf("\n");
  }
  print_stats(res.stats, speculated, pool.size());
  return 0;
}

int run_tokenize(int argc, char** argv, bool detok) {
  Args a(argc, argv, 2, {"help"}, {"model", "tokenizer", "text", "ids"});
  if (a.has("help")) {
    std::fputs(kTokenizeUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
  if (a.has("model") && a.has("tokenizer")) throw UsageError("give --model or --tokenizer, not both");
  Tokenizer tok = [&] {
    if (a.has("tokenizer")) return Tokenizer::from_file(a.get("tokenizer"));
    const std::string dir = a.get("model", default_model());
    if (!has_tokenizer(dir)) throw Error(dir + ": no tokenizer.json");
    return Tokenizer::from_dir(dir);
  }();
  if (detok) {
    if (!a.has("ids")) throw UsageError("--ids is required");
    std::cout << tok.decode(parse_id_list(a.get("ids"), "--ids")) << std::endl;
  } else {
    if (!a.has("text")) throw UsageError("--text is required");
    std::cout << nlohmann::json(tok.encode(a.get("text"))).dump() << std::endl;
  }
  return 0;
}

int run_logits(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "draft"},
         {"model", "ids", "output", "threads", "device", "tensor-parallel", "weights"});
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional()[0] + "'");
  if (a.has("help")) {
    std::fputs(kLogitsUsage, stdout);
    return 0;
  }
  for (const char* req : {"model", "ids", "output"})
    if (!a.has(req)) throw UsageError(std::string("--") + req + " is required");
  check_output_outside_checkpoint(a.get("output"), a.get("model"));
  apply_weights_option(a);
  auto ids = parse_id_list(a.get("ids"), "--ids");
  ThreadPool pool(thread_count(a));
  const std::unique_ptr<Model> loaded = load_command_model(a.get("model"), pool, tensor_parallel(a));
  Model& model = *loaded;
  model.prefault(/*progress=*/false);  // (also refuses a checkpoint holding NaN or inf, naming the tensor)
  place_model(model, device_option(a));
  const int64_t T = ids.size(), V = model.facts().vocab_size, H = model.facts().hidden_width;
  const std::unique_ptr<SequenceState> seq = model.new_sequence(T);
  std::vector<float> logits(T * V), hidden(T * H);
  const BatchSegment prompt_rows{seq.get(), ids.data(), T, /*all_logits=*/true};
  model.forward(&prompt_rows, 1, logits.data(), hidden.data());
  require_finite(logits.data(), T, V, "logits: not writing " + a.get("output") + ": the target's logits");
  SafetensorsWriter w;
  w.add_f32("logits", {T, V}, logits.data());
  if (a.has("draft")) {
    if (model.facts().num_mtp_layers == 0) throw Error(a.get("model") + ": --draft needs MTP layers (num_nextn_predict_layers >= 1)");
    if (T < 2) throw UsageError("--draft needs a prompt of at least 2 tokens");
    std::vector<float> dl((T - 1) * V);
    model.prompt_draft_logits(ids.data(), T, hidden.data(), dl.data());
    require_finite(dl.data(), T - 1, V, "logits: not writing " + a.get("output") + ": MTP layer 0's draft_logits");
    w.add_f32("draft_logits", {T - 1, V}, dl.data());
  }
  w.write(a.get("output"));
  std::fprintf(stderr, "wrote %s\n", a.get("output").c_str());
  return 0;
}

}  // namespace
}  // namespace nextn::cli

int main(int argc, char** argv) {
  using namespace nextn::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kMainUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "generate") return run_generate(argc, argv);
    if (cmd == "logits") return run_logits(argc, argv);
    if (cmd == "inspect") return run_inspect(argc, argv);
    if (cmd == "bench") return run_bench(argc, argv);
    if (cmd == "serve") return run_serve(argc, argv);
    if (cmd == "tensor-parallel-rank") return run_tensor_parallel_rank_command(argc, argv);
    if (cmd == "tokenize" || cmd == "detokenize") return run_tokenize(argc, argv, cmd == "detokenize");
    std::fprintf(stderr, "nextn: unknown command '%s'\n\n%s", cmd.c_str(), kMainUsage);
    return 2;
  } catch (const UsageError& e) {
    usage_exit(cmd, e.what());
  } catch (const nextn::Error& e) {
    std::fprintf(stderr, "nextn: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nextn: internal error: %s\n", e.what());
    return 1;
  }
}
