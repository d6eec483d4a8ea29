// The engine behind the HTTP server: one thread owns the Engine (continuous batching, speculation) and steps
// it while any request is live; HTTP handler threads hand it Jobs and read their choices' output as it grows.
//
//   HTTP thread: parse -> Job -> submit() --(inbox)--> engine thread: Engine::submit, step, step, ...
//                wait on the Job's condition <----------- on_token: text, ids, logprobs appended to the Job
//   client gone: cancel() --(cancel list)------------->  Engine::cancel: pages freed before the next step
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "io/tokenizer.h"
#include "serve/metrics.h"
#include "serve/openai_request.h"
#include "serve/openai_response.h"

namespace nextn::serve {

using Clock = std::chrono::steady_clock;

// One HTTP request. The engine thread appends to `out` under `m` and notifies `cv`; the HTTP thread reads.
struct Job {
  ApiRequest request;
  ResponseHeader header;
  int64_t prompt_tokens = 0;  // summed over the prompts (not over the n choices of each)
  Clock::time_point arrival = Clock::now();

  std::mutex m;
  std::condition_variable cv;
  enum class State { kQueued, kRunning, kRefused } state = State::kQueued;  // (under m)
  std::string refusal;                                                      // kRefused: why (a 400)
  std::vector<ChoiceOutput> out;                                            // (under m)
  size_t finished = 0;                                                      // choices done (under m)
  std::atomic<bool> cancelled{false};
  std::vector<int64_t> engine_ids;  // its choices' ids in the engine (engine thread only)

  bool done() const { return finished == out.size(); }  // (under m)
};

struct ServiceOptions {
  int max_sequences = 64;  // decoding at once (more wait in the engine's queue)
  int max_queue = 256;     // choices waiting for a slot; beyond it, 429
};

class EngineService {
 public:
  EngineService(Model& model, const Tokenizer* tok, Metrics& metrics, ServiceOptions options);
  ~EngineService();  // cancels what is left and joins the engine thread
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // Hands the job to the engine and waits until it is running or refused. Throws ApiError: 429 when the
  // queue is full, 503 while draining, 400 when the engine refuses the request (e.g. its KV would not fit).
  void submit(const std::shared_ptr<Job>& job);
  // The client went away: the job's sequences end and free their pages before the next engine step.
  void cancel(const std::shared_ptr<Job>& job);
  // Shutdown: new jobs get 503; wait_idle() returns once every job has finished.
  void begin_drain();
  bool draining() const { return draining_; }
  // Empty while the model can serve; else why not (Model::failure).
  std::string model_failure() const { return model_.failure(); }
  void wait_idle();

 private:
  struct Live;  // one choice in the engine (engine thread only)
  void loop();
  void start(const std::shared_ptr<Job>& job);
  void refuse(Job& job, const std::string& why);
  bool on_token(Live& live, int32_t token, const TokenLogprob* logprob);
  void finish(int64_t id, GenerationResult& result);
  void publish_load();
  void warn_if_drafts_broken(const SpecStats& stats);  // (broken_drafts_warning, on stderr once)

  Model& model_;
  const Tokenizer* tok_;
  Metrics& metrics_;
  ServiceOptions options_;
  Engine engine_;

  std::mutex inbox_m_;
  std::condition_variable inbox_cv_, idle_cv_;
  std::vector<std::shared_ptr<Job>> inbox_, cancels_;  // (under inbox_m_)
  int64_t live_jobs_ = 0;                              // submitted, not yet finished (under inbox_m_)
  int64_t engine_waiting_ = 0;                         // choices in the engine's queue (under inbox_m_)
  bool stop_ = false;                                  // (under inbox_m_)
  std::atomic<bool> draining_{false};

  // Engine thread only.
  std::unordered_map<int64_t, std::shared_ptr<Live>> live_;  // engine id -> choice
  int64_t step_ = 0;
  int64_t draft_tokens_ = 0, accepted_tokens_ = 0;  // every finished request's, until drafts_warned_
  bool drafts_warned_ = false;
  std::thread thread_;
};

}  // namespace nextn::serve
