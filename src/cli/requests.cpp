// `nextn generate --requests FILE.jsonl`: many requests at once through the engine's scheduler. One JSON object
// a line: {"ids": [..]} or {"prompt": "text"}, and optionally max_tokens, temperature, top_k, top_p, min_p, seed,
// speculative_tokens, ignore_eos, stop, logprobs, response_format (OpenAI's: json_object or json_schema; the
// command line's options are the defaults, --json-object / --json-schema that of response_format). Prints one JSON
// line per request, in input order, with the fields of `generate --json`; a line that is not a valid request
// prints {"line": N, "error": "..."} in its place and the others still run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "engine/engine.h"
#include "engine/structured/grammar.h"
#include "engine/structured/token_filter.h"
#include "engine/text_stream.h"
#include "models/registry.h"
#include "serve/openai_request.h"

namespace nextn::cli {
namespace {

using nlohmann::json;

struct Job {
  int line = 0;
  std::string error;  // the line is not a valid request
  Request request;
  std::unique_ptr<TextStream> text;
  std::optional<GenerationResult> result;
};

// A field of the request line, checked like the command-line option it overrides.
template <class T>
T field(const json& j, const char* name, T def, double lo, double hi) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) throw Error(std::string("field '") + name + "' must be a number, got " + it->dump());
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) throw Error(std::string("field '") + name + "' must be an integer, got " + it->dump());
  }
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    throw Error(std::string("field '") + name + "' must be in " + json(lo).dump() + ".." + json(hi).dump() + ", got " +
                it->dump());
  if constexpr (std::is_same_v<T, uint64_t>) return it->get<uint64_t>();
  return static_cast<T>(it->is_number_integer() ? double(it->get<int64_t>()) : v);
}

bool flag(const json& j, const char* name, bool def) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw Error(std::string("field '") + name + "' must be true or false, got " + it->dump());
  return it->get<bool>();
}

// The vocabulary's bytes for structured output, made at the first request that asks for it.
struct LazyVocab {
  const Tokenizer* tok;
  int64_t vocab_size;
  std::shared_ptr<const structured::TokenVocab> vocab;
  const std::shared_ptr<const structured::TokenVocab>& get() {
    if (!tok) throw Error("structured output needs a tokenizer (the model has no tokenizer.json)");
    if (!vocab) vocab = structured::TokenVocab::from_tokenizer(*tok, vocab_size);
    return vocab;
  }
};

// One line -> a request: the command line's parameters overridden by the line's fields.
void parse_job(const std::string& text, const RequestDefaults& d, const Tokenizer* tok, const ModelFacts& facts,
               LazyVocab& vocab, Job& job) {
  // Parsed once, in the line's key order (a schema's properties come out in it); the checks below read a
  // std::map copy, whose sorted keys their messages name as before.
  nlohmann::ordered_json line;
  try {
    line = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(std::string("not valid JSON (") + e.what() + ")");
  }
  const json j(line);
  if (!j.is_object()) throw Error("a request must be a JSON object");
  for (auto item = j.begin(); item != j.end(); ++item) {
    const std::string key = item.key();
    static const char* known[] = {"ids",   "prompt", "max_tokens", "temperature",        "top_k",      "top_p",
                                  "min_p", "seed",   "stop",       "speculative_tokens", "ignore_eos", "logprobs",
                                  "response_format", "logit_bias", "min_tokens"};
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) == std::end(known))
      throw Error("unknown field '" + key + "'");
  }
  Request& r = job.request;
  r.params = d.params;
  r.spec = d.spec;
  if (j.contains("ids") == j.contains("prompt")) throw Error("give either \"ids\" or \"prompt\"");
  if (j.contains("ids")) {
    const json& ids = j["ids"];
    if (!ids.is_array()) throw Error("field 'ids' must be an array of token ids");
    for (const json& t : ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= facts.vocab_size)
        throw Error("field 'ids' holds " + t.dump() + ", not a token id of this model (0.." +
                    std::to_string(facts.vocab_size - 1) + ")");
      r.prompt.push_back(t.get<int32_t>());
    }
  } else {
    if (!j["prompt"].is_string()) throw Error("field 'prompt' must be a string");
    if (!tok) throw Error("field 'prompt' needs a tokenizer (the model has no tokenizer.json): give \"ids\"");
    r.prompt = tok->encode(j["prompt"].get<std::string>(), /*add_special=*/true);
  }
  r.params.max_tokens = field<int>(j, "max_tokens", r.params.max_tokens, 0, INT32_MAX);
  r.params.temperature = field<float>(j, "temperature", r.params.temperature, 0, 3.4e38);
  r.params.top_k = field<int>(j, "top_k", r.params.top_k, 0, INT32_MAX);
  r.params.top_p = field<float>(j, "top_p", r.params.top_p, 1e-30, 1);
  r.params.min_p = field<float>(j, "min_p", r.params.min_p, 0, 1);
  r.params.seed = field<uint64_t>(j, "seed", r.params.seed, 0, 1.8446744073709552e19);
  r.params.logprobs = field<int>(j, "logprobs", r.params.logprobs, -1, 20);
  r.params.min_tokens = field<int>(j, "min_tokens", r.params.min_tokens, 0, INT32_MAX);
  if (j.contains("logit_bias") && !j["logit_bias"].is_null())
    r.params.logit_bias = serve::logit_bias_from_json(j["logit_bias"], facts.vocab_size);
  if (j.contains("stop")) {
    const json& s = j["stop"];
    r.params.stop.clear();
    if (s.is_string()) {
      r.params.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) throw Error("field 'stop' must be a string or an array of strings");
        r.params.stop.push_back(x.get<std::string>());
      }
    } else {
      throw Error("field 'stop' must be a string or an array of strings");
    }
  }
  if (j.contains("speculative_tokens")) {
    r.spec.num_speculative_tokens = field<int>(j, "speculative_tokens", 3, 0, 8);
    r.spec.enabled = r.spec.num_speculative_tokens > 0;
    r.spec.num_speculative_tokens = std::max(1, r.spec.num_speculative_tokens);
    r.spec.tune_k = false;  // an explicit k is kept
  }
  if (!flag(j, "ignore_eos", d.ignore_eos))
    for (int32_t e : facts.eos_token_ids) r.params.stop_token_ids.push_back(e);
  r.params.validate();
  r.spec.validate();
  std::shared_ptr<const structured::Matcher> format = d.format;
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const auto g = structured::grammar_of_response_format(line.at("response_format"), "response_format");
    format = g ? std::make_shared<const structured::Matcher>(*g) : nullptr;
  }
  if (format) r.format = OutputFormat{format, vocab.get()};
  job.text = std::make_unique<TextStream>(tok, r.params.stop, r.params.min_tokens);
  TextStream* stream = job.text.get();
  r.on_token = [stream](int32_t t, const TokenLogprob*) { return !stream->has_tokenizer() || !stream->push(t).stopped; };
}

json result_json(Job& job) {
  if (!job.error.empty()) return {{"line", job.line}, {"error", job.error}};
  GenerationResult& r = *job.result;
  if (r.finish_reason == "error") return {{"line", job.line}, {"error", r.error}};
  job.text->finish();
  json out = {{"ids", r.ids}, {"finish_reason", r.finish_reason}, {"stats", stats_json(r.stats)}};
  if (job.text->has_tokenizer()) out["text"] = job.text->text();
  if (job.request.params.logprobs >= 0) out["logprobs"] = logprobs_json(r.logprobs);
  return out;
}

}  // namespace

int run_requests(const std::string& path, const RequestDefaults& defaults, const std::string& model_dir,
                 const Tokenizer* tok, int threads, const MemoryOptions& memory, int max_sequences,
                 const std::string& device, int tensor_parallel, DraftHeadKind draft_head) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the requests file");
  ThreadPool pool(threads);
  const std::unique_ptr<Model> model = load_command_model(model_dir, pool, tensor_parallel);
  model->prefault(/*progress=*/true);
  place_model(*model, device);
  model->use_draft_head(draft_head);
  model->configure_memory(memory);
  Engine engine(*model, EngineOptions{max_sequences});
  LazyVocab vocab{tok, model->facts().vocab_size, nullptr};

  std::vector<Job> jobs;
  std::map<int64_t, size_t> job_of;  // engine id -> job
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are not requests
    Job& job = jobs.emplace_back();
    job.line = line;
    try {
      parse_job(text, defaults, tok, model->facts(), vocab, job);
      job_of[engine.submit(job.request)] = jobs.size() - 1;
    } catch (const Error& e) {
      job.error = path + ":" + std::to_string(line) + ": " + e.what();
    }
  }
  // Results in input order, each printed as soon as the ones before it are done.
  size_t printed = 0;
  int failed = 0;
  auto print_ready = [&] {
    for (; printed < jobs.size() && (!jobs[printed].error.empty() || jobs[printed].result); ++printed) {
      const json out = result_json(jobs[printed]);
      failed += out.contains("error");
      std::cout << out.dump() << std::endl;
    }
  };
  {  // every decode shape of the batch these requests make, recorded before the first step (on a GPU, as serve)
    int64_t sequences = 0, per_sequence = 1, positions = 1;
    for (const Job& j : jobs) {
      if (!j.error.empty()) continue;
      const SpecOptions& s = j.request.spec;
      const int k = s.enabled ? s.num_speculative_tokens : 0;
      ++sequences;
      per_sequence = std::max(per_sequence, forward_rows_per_sequence(k));
      positions = std::max(positions, int64_t(j.request.prompt.size()) + j.request.params.max_tokens + k + 2);
    }
    prepare_forwards(*model, std::min<int64_t>(sequences, max_sequences) * per_sequence, positions, /*quiet=*/false);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0, draft_tokens = 0, accepted = 0;
  print_ready();
  while (!engine.idle()) {
    engine.step();
    for (auto& [id, res] : engine.take_finished()) {
      generated += res.stats.num_generated;
      draft_tokens += res.stats.num_draft_tokens;
      accepted += res.stats.num_accepted_tokens;
      jobs[job_of.at(id)].result = std::move(res);
    }
    print_ready();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%zu requests (%d failed): %lld tokens in %.3f s, %.1f tokens/s aggregate, %lld engine steps "
               "(CPU kernels %s; %s)\n", jobs.size(), failed, (long long)generated, seconds,
               seconds > 0 ? double(generated) / seconds : 0.0, (long long)engine.steps(), cpu_target_text().c_str(),
               model->memory_summary().c_str());
  if (const std::string w = broken_drafts_warning(draft_tokens, accepted); !w.empty())
    std::fprintf(stderr, "%s\n", w.c_str());
  return failed ? 1 : 0;
}

}  // namespace nextn::cli
