// /metrics: vLLM's names and labels, cumulative histogram buckets, counters that add up what finished.
#include "serve/metrics.h"

#include <gtest/gtest.h>

namespace nextn::serve {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, CountersGaugesAndHistogramsUseVllmNames) {
  Metrics m("tiny");
  GenerationResult r;
  r.ids = {1, 2, 3, 4, 5};
  r.finish_reason = "length";
  r.stats.prompt_tokens = 7;
  r.stats.num_drafts = 2;
  r.stats.num_draft_tokens = 6;
  r.stats.num_accepted_tokens = 4;
  r.stats.accepted_per_position = {2, 1, 1};
  m.observe_finished(r, 0.7);
  r.finish_reason = "abort";
  m.observe_finished(r, 0.2);
  m.observe_first_token(0.03);
  m.observe_inter_token(0.02);
  m.set_load(3, 1, 0.25);
  const std::string text = m.render();
  const std::string L = "model_name=\"tiny\",engine=\"0\"";
  EXPECT_TRUE(has_line(text, "vllm:num_requests_running{" + L + "} 3")) << text;
  EXPECT_TRUE(has_line(text, "vllm:num_requests_waiting{" + L + "} 1"));
  EXPECT_TRUE(has_line(text, "vllm:kv_cache_usage_perc{" + L + "} 0.25"));
  EXPECT_TRUE(has_line(text, "vllm:prompt_tokens_total{" + L + "} 14"));
  EXPECT_TRUE(has_line(text, "vllm:generation_tokens_total{" + L + "} 10"));
  EXPECT_TRUE(has_line(text, "vllm:request_success_total{" + L + ",finished_reason=\"length\"} 1"));
  EXPECT_TRUE(has_line(text, "vllm:request_success_total{" + L + ",finished_reason=\"abort\"} 1"));
  EXPECT_TRUE(has_line(text, "vllm:spec_decode_num_drafts_total{" + L + "} 4"));
  EXPECT_TRUE(has_line(text, "vllm:spec_decode_num_draft_tokens_total{" + L + "} 12"));
  EXPECT_TRUE(has_line(text, "vllm:spec_decode_num_accepted_tokens_total{" + L + "} 8"));
  EXPECT_TRUE(has_line(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total{" + L + ",position=\"2\"} 2"));
  EXPECT_TRUE(has_line(text, "# TYPE vllm:e2e_request_latency_seconds histogram"));
  // cumulative buckets: 0.2 is under 0.3, 0.7 under 0.8
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_bucket{" + L + ",le=\"0.3\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_bucket{" + L + ",le=\"0.8\"} 2"));
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_bucket{" + L + ",le=\"+Inf\"} 2"));
  EXPECT_TRUE(has_line(text, "vllm:e2e_request_latency_seconds_count{" + L + "} 2"));
  EXPECT_TRUE(has_line(text, "vllm:time_to_first_token_seconds_count{" + L + "} 1"));
  EXPECT_TRUE(has_line(text, "vllm:inter_token_latency_seconds_count{" + L + "} 1"));
}

TEST(Metrics, TheKTunersEstimatesPerBatchClass) {
  Metrics m("tiny");
  m.set_tuners({{8, 15, {0.0005, 0.000625, 0.0}, {300, 40, 0}, 0, 0.25, -1.5, {0, 1, 0}}});
  const std::string text = m.render();
  const std::string L = "model_name=\"tiny\",engine=\"0\",batch_class=\"8\"";
  EXPECT_TRUE(has_line(text, "# TYPE nextn:spec_decode_tuner_seconds_per_token gauge")) << text;
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_seconds_per_token{" + L + ",k=\"1\"} 0.000625")) << text;
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_seconds_per_token{" + L + ",k=\"2\"} 0"));
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_rounds_total{" + L + ",k=\"0\"} 300"));
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_noise{" + L + "} 0.25")) << text;
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_budget_tokens{" + L + "} -1.5"));
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_best_k{" + L + "} 0"));
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_ruled_out{" + L + ",k=\"1\"} 1"));
  EXPECT_TRUE(has_line(text, "nextn:spec_decode_tuner_ruled_out{" + L + ",k=\"2\"} 0"));
  m.set_tuners({});
  EXPECT_EQ(m.render().find("batch_class"), std::string::npos);  // (a new set replaces the old)
}

}  // namespace
}  // namespace nextn::serve
