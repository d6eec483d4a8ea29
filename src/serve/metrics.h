// The server's Prometheus metrics, named as vLLM's (docs/server.md) so that dashboards made for vLLM work.
// Written by the engine thread, read by /metrics: every member function locks.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"

namespace nextn::serve {

// A cumulative histogram with fixed upper bounds (Prometheus' le buckets, plus +Inf).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // The histogram's lines: name_bucket{labels,le=...}, name_sum, name_count.
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative)
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void observe_first_token(double seconds_since_arrival);
  void observe_inter_token(double seconds);
  // A finished request choice: counters, latency and size histograms, speculation stats.
  void observe_finished(const GenerationResult& result, double e2e_seconds);
  void set_load(int64_t running, int64_t waiting, double kv_usage);
  // The k tuners' estimates and rounds per batch size class (nextn's own gauges, beside vLLM's).
  void set_tuners(std::vector<Engine::TunerClass> classes);

  std::string render() const;  // Prometheus text exposition format 0.0.4

 private:
  mutable std::mutex m_;
  std::string labels_;  // model_name="...",engine="0"
  int64_t running_ = 0, waiting_ = 0;
  double kv_usage_ = 0;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, uint64_t> success_;  // finished_reason -> requests
  uint64_t drafts_ = 0, draft_tokens_ = 0, accepted_ = 0;
  std::vector<uint64_t> accepted_per_pos_;
  std::vector<Engine::TunerClass> tuners_;
  Histogram ttft_, itl_, e2e_, prompt_len_, gen_len_;
};

}  // namespace nextn::serve
