#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace nextn::serve {
namespace {

// vLLM's bucket bounds for the latency histograms (seconds) and powers of two for token counts.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                         2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0,
                                        20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
std::vector<double> token_bounds() {
  std::vector<double> b;
  for (double x = 1; x <= 1 << 20; x *= 2) b.push_back(x);
  return b;
}

// The shortest decimal that reads back as v (bucket bounds print as 0.3, not 0.29999999999999999).
std::string number(double v) {
  char buf[64];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + number(v) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + number(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + escape_label(model_name) + "\",engine=\"0\""),
      ttft_(kTtftBounds), itl_(kItlBounds), e2e_(kE2eBounds), prompt_len_(token_bounds()), gen_len_(token_bounds()) {}

void Metrics::observe_first_token(double s) {
  std::lock_guard lock(m_);
  ttft_.observe(s);
}

void Metrics::observe_inter_token(double s) {
  std::lock_guard lock(m_);
  itl_.observe(s);
}

void Metrics::observe_finished(const GenerationResult& r, double e2e_seconds) {
  std::lock_guard lock(m_);
  const SpecStats& s = r.stats;
  prompt_tokens_ += uint64_t(s.prompt_tokens);
  generation_tokens_ += uint64_t(r.ids.size());
  ++success_[r.finish_reason];
  drafts_ += uint64_t(s.num_drafts);
  draft_tokens_ += uint64_t(s.num_draft_tokens);
  accepted_ += uint64_t(s.num_accepted_tokens);
  if (accepted_per_pos_.size() < s.accepted_per_position.size()) accepted_per_pos_.resize(s.accepted_per_position.size());
  for (size_t i = 0; i < s.accepted_per_position.size(); ++i) accepted_per_pos_[i] += uint64_t(s.accepted_per_position[i]);
  e2e_.observe(e2e_seconds);
  prompt_len_.observe(double(s.prompt_tokens));
  gen_len_.observe(double(r.ids.size()));
}

void Metrics::set_load(int64_t running, int64_t waiting, double kv_usage) {
  std::lock_guard lock(m_);
  running_ = running;
  waiting_ = waiting;
  kv_usage_ = kv_usage;
}

void Metrics::set_tuners(std::vector<Engine::TunerClass> classes) {
  std::lock_guard lock(m_);
  tuners_ = std::move(classes);
}

std::string Metrics::render() const {
  std::lock_guard lock(m_);
  std::string out;
  const std::string& L = labels_;
  header(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  sample(out, "vllm:num_requests_running", L, double(running_));
  header(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample(out, "vllm:num_requests_waiting", L, double(waiting_));
  header(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample(out, "vllm:kv_cache_usage_perc", L, kv_usage_);
  header(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  sample(out, "vllm:prompt_tokens_total", L, double(prompt_tokens_));
  header(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  sample(out, "vllm:generation_tokens_total", L, double(generation_tokens_));
  header(out, "vllm:request_success_total", "counter", "Count of finished requests by finish reason.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    const auto it = success_.find(reason);
    sample(out, "vllm:request_success_total", L + ",finished_reason=\"" + reason + "\"",
           double(it == success_.end() ? 0 : it->second));
  }
  header(out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
  sample(out, "vllm:spec_decode_num_drafts_total", L, double(drafts_));
  header(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
  sample(out, "vllm:spec_decode_num_draft_tokens_total", L, double(draft_tokens_));
  header(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
  sample(out, "vllm:spec_decode_num_accepted_tokens_total", L, double(accepted_));
  header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Accepted tokens per draft position.");
  for (size_t i = 0; i < accepted_per_pos_.size(); ++i)
    sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", L + ",position=\"" + std::to_string(i) + "\"",
           double(accepted_per_pos_[i]));
  // The k tuner per batch size class (sequences decoding at once: min_sequences .. 2 min_sequences - 1): what
  // it estimates a sequence's token costs at each k (0: not measured yet), and the rounds it ran at each.
  const auto tuner_labels = [&](const Engine::TunerClass& c, size_t k) {
    return L + ",batch_class=\"" + std::to_string(c.min_sequences) + "\",k=\"" + std::to_string(k) + "\"";
  };
  header(out, "nextn:spec_decode_tuner_seconds_per_token", "gauge",
         "The k tuner's estimate of a sequence's time per token at each k, per batch size class.");
  for (const Engine::TunerClass& c : tuners_)
    for (size_t k = 0; k < c.seconds_per_token.size(); ++k)
      sample(out, "nextn:spec_decode_tuner_seconds_per_token", tuner_labels(c, k), c.seconds_per_token[k]);
  header(out, "nextn:spec_decode_tuner_rounds_total", "counter",
         "Sequence-rounds run at each k, per batch size class.");
  for (const Engine::TunerClass& c : tuners_)
    for (size_t k = 0; k < c.rounds.size(); ++k)
      sample(out, "nextn:spec_decode_tuner_rounds_total", tuner_labels(c, k), double(c.rounds[k]));
  // (why a class runs what it runs: the margin a k > 0 must win by grows with the noise; probes wait for a
  // budget that is not negative; a k that smaller batches' costs rule out is never probed)
  const auto class_labels = [&](const Engine::TunerClass& c) {
    return L + ",batch_class=\"" + std::to_string(c.min_sequences) + "\"";
  };
  const struct {
    const char* name;
    const char* help;
    double Engine::TunerClass::*field;
  } gauges[] = {{"nextn:spec_decode_tuner_noise",
                 "The relative spread of the tuner's round times, per batch size class.", &Engine::TunerClass::noise},
                {"nextn:spec_decode_tuner_budget_tokens",
                 "The tuner's probe budget in plain tokens' time, per batch size class.",
                 &Engine::TunerClass::budget_tokens}};
  for (const auto& g : gauges) {
    header(out, g.name, "gauge", g.help);
    for (const Engine::TunerClass& c : tuners_) sample(out, g.name, class_labels(c), c.*g.field);
  }
  header(out, "nextn:spec_decode_tuner_best_k", "gauge",
         "The k the tuner runs when not probing, per batch size class.");
  for (const Engine::TunerClass& c : tuners_) sample(out, "nextn:spec_decode_tuner_best_k", class_labels(c), c.best_k);
  header(out, "nextn:spec_decode_tuner_ruled_out", "gauge",
         "1 for a k that smaller batches' measured costs rule out (never probed), per batch size class.");
  for (const Engine::TunerClass& c : tuners_)
    for (size_t k = 0; k < c.hopeless.size(); ++k)
      sample(out, "nextn:spec_decode_tuner_ruled_out", tuner_labels(c, k), c.hopeless[k] ? 1.0 : 0.0);
  const auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    h.render(out, name, L);
  };
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", gen_len_);
  return out;
}

}  // namespace nextn::serve
