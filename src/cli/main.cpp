// nextn command-line front-end.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "io/safetensors.h"
#include "models/hy_v4.h"
#include "spec/generator.h"

namespace nextn::cli {
namespace {

const char* kMainUsage = R"(nextn: HY V4 inference with native MTP speculative decoding.

usage: nextn <command> [options]

commands:
  generate   generate tokens (greedy or sampled), speculating with the checkpoint's MTP layers
  logits     write the logits of a prompt (and of the MTP draft layer) to a safetensors file
  inspect    describe a checkpoint folder: architecture, quantization, MTP layers, problems

Run `nextn <command> --help` for the options of a command.
)";

const char* kGenerateUsage = R"(usage: nextn generate --model DIR --ids 1,2,3 [options]

Generates after the prompt. Speculative decoding with the checkpoint's own MTP layers is on by default
when the checkpoint has them; greedy output is identical to the target's, sampled output is distributed
exactly as the target's.

  --model DIR               HuggingFace checkpoint folder (config.json + *.safetensors)
  --ids LIST                prompt token ids, comma separated
  -n, --max-tokens N        tokens to generate (default 32)
  --json                    print {"ids": [...], "stats": {...}} on stdout
  --speculative-tokens K    draft K tokens per step, 1..8 (default 3)
  --no-speculate            plain decoding
  --no-draft-probs          verify as if the draft were one-hot (exact, lower acceptance; for comparison)
  --temperature T           0 = greedy (default 0)
  --top-k K, --top-p P, --min-p P, --seed S
  --repetition-penalty R, --presence-penalty P, --frequency-penalty F
  --stop-id ID              stop after this token id (repeatable)
  --ignore-eos              do not stop at the checkpoint's eos token
  --relaxed-acceptance N,D  LOSSY: also accept drafts in the target's top-N within D of its top probability
  --adaptive THRESHOLD      shrink k while the rolling acceptance rate is under THRESHOLD (probe later)
  --threads N               worker threads (default: all cores)
)";

const char* kLogitsUsage = R"(usage: nextn logits --model DIR --ids 1,2,3 --output FILE.safetensors [--draft]

Writes tensor `logits` (F32, [T, V]) for the prompt. With --draft also `draft_logits` (F32, [T-1, V]):
MTP layer 0 over the prompt, position p fed token p+1 and the target's hidden state at p.

  --model DIR     checkpoint folder
  --ids LIST      prompt token ids, comma separated
  --output FILE   output .safetensors path
  --draft         also write draft_logits
  --threads N     worker threads (default: all cores)
)";

[[noreturn]] void usage_exit(const char* usage, const std::string& msg) {
  std::fprintf(stderr, "nextn: %s\n\n%s", msg.c_str(), usage);
  std::exit(2);
}

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
          {"decode_seconds", s.decode_seconds}};
}

void print_stats(const SpecStats& s, bool speculated) {
  std::fprintf(stderr, "generated %lld tokens in %.3f s (%.1f tokens/s), %lld target forwards\n",
               (long long)s.num_generated, s.decode_seconds, s.tokens_per_second(), (long long)s.target_forwards);
  if (!speculated) return;
  std::fprintf(stderr, "speculation: %lld drafts, %lld draft tokens, %lld accepted, mean acceptance length %.3f\n",
               (long long)s.num_drafts, (long long)s.num_draft_tokens, (long long)s.num_accepted_tokens,
               s.mean_acceptance_length());
  std::fprintf(stderr, "per-position acceptance:");
  for (double a : s.per_position_acceptance()) std::fprintf(stderr, " %.3f", a);
  std::fprintf(stderr, "\n");
}

int run_generate(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "json", "no-speculate", "no-draft-probs", "ignore-eos"},
         {"model", "ids", "n", "max-tokens", "speculative-tokens", "temperature", "top-k", "top-p", "min-p", "seed",
          "repetition-penalty", "presence-penalty", "frequency-penalty", "stop-id", "relaxed-acceptance",
          "adaptive", "threads"});
  if (a.has("help")) {
    std::fputs(kGenerateUsage, stdout);
    return 0;
  }
  if (!a.has("model")) throw UsageError("--model is required");
  if (!a.has("ids")) throw UsageError("--ids is required");
  SamplingParams sp;
  sp.max_tokens = static_cast<int>(a.get_int("max-tokens", a.get_int("n", 32)));
  sp.temperature = static_cast<float>(a.get_double("temperature", 0.0));
  sp.top_k = static_cast<int>(a.get_int("top-k", 0));
  sp.top_p = static_cast<float>(a.get_double("top-p", 1.0));
  sp.min_p = static_cast<float>(a.get_double("min-p", 0.0));
  sp.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  sp.repetition_penalty = static_cast<float>(a.get_double("repetition-penalty", 1.0));
  sp.presence_penalty = static_cast<float>(a.get_double("presence-penalty", 0.0));
  sp.frequency_penalty = static_cast<float>(a.get_double("frequency-penalty", 0.0));
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
  so.num_speculative_tokens = static_cast<int>(a.get_int("speculative-tokens", 3));
  so.use_draft_probs = !a.has("no-draft-probs");
  if (a.has("relaxed-acceptance")) {
    const std::string v = a.get("relaxed-acceptance");
    const auto comma = v.find(',');
    if (comma == std::string::npos) throw UsageError("--relaxed-acceptance expects N,DELTA (e.g. 3,0.1)");
    so.relaxed = true;
    try {
      so.relaxed_top_n = std::stoi(v.substr(0, comma));
      so.relaxed_delta = std::stof(v.substr(comma + 1));
    } catch (const std::exception&) {
      throw UsageError("--relaxed-acceptance expects N,DELTA (e.g. 3,0.1)");
    }
  }
  if (a.has("adaptive")) {
    so.adaptive = true;
    so.adaptive_threshold = static_cast<float>(a.get_double("adaptive", 0.3));
  }
  try {
    so.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  auto prompt = parse_id_list(a.get("ids"), "--ids");

  ThreadPool pool(static_cast<int>(a.get_int("threads", 0)));
  HYV4Model model(a.get("model"), &pool);
  if (!a.has("ignore-eos"))
    for (int64_t e : model.config().eos_token_ids) sp.stop_token_ids.push_back(static_cast<int32_t>(e));
  const bool json = a.has("json");
  Generator gen(model);
  auto res = gen.generate(prompt, sp, so, [&](int32_t t) {
    if (!json) {
      std::printf("%d ", t);
      std::fflush(stdout);
    }
    return true;
  });
  const bool speculated = so.enabled && model.num_mtp_layers() > 0;
  if (json) {
    nlohmann::json out = {{"ids", res.ids}, {"finish_reason", res.finish_reason}, {"stats", stats_json(res.stats)}};
    std::cout << out.dump() << std::endl;
  } else {
    std::printf("\n");
  }
  print_stats(res.stats, speculated);
  return 0;
}

int run_logits(int argc, char** argv) {
  Args a(argc, argv, 2, {"help", "draft"}, {"model", "ids", "output", "threads"});
  if (a.has("help")) {
    std::fputs(kLogitsUsage, stdout);
    return 0;
  }
  for (const char* req : {"model", "ids", "output"})
    if (!a.has(req)) throw UsageError(std::string("--") + req + " is required");
  auto ids = parse_id_list(a.get("ids"), "--ids");
  ThreadPool pool(static_cast<int>(a.get_int("threads", 0)));
  HYV4Model model(a.get("model"), &pool);
  const int64_t T = ids.size(), V = model.config().vocab_size, H = model.config().hidden_size;
  KVCache cache = model.new_cache(T);
  std::vector<float> logits(T * V), hidden(T * H);
  model.forward(ids.data(), T, cache, logits.data(), hidden.data());
  SafetensorsWriter w;
  w.add_f32("logits", {T, V}, logits.data());
  if (a.has("draft")) {
    if (model.num_mtp_layers() == 0) throw Error(a.get("model") + ": --draft needs MTP layers (num_nextn_predict_layers >= 1)");
    if (T < 2) throw UsageError("--draft needs a prompt of at least 2 tokens");
    KVCache dc = model.new_draft_cache(T);
    std::vector<float> dl((T - 1) * V);
    model.draft_forward(0, ids.data() + 1, hidden.data(), T - 1, 0, dc, dl.data(), nullptr);
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
  const char* usage = kMainUsage;
  try {
    if (cmd == "generate") {
      usage = kGenerateUsage;
      return run_generate(argc, argv);
    }
    if (cmd == "logits") {
      usage = kLogitsUsage;
      return run_logits(argc, argv);
    }
    if (cmd == "inspect") return run_inspect(argc, argv);
    usage_exit(kMainUsage, "unknown command '" + cmd + "'");
  } catch (const UsageError& e) {
    usage_exit(usage, e.what());
  } catch (const nextn::Error& e) {
    std::fprintf(stderr, "nextn: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nextn: internal error: %s\n", e.what());
    return 1;
  }
}
