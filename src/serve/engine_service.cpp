#include "serve/engine_service.h"

#include <cstdio>

#include "core/error.h"
#include "engine/text_stream.h"
#include "serve/api_error.h"

namespace nextn::serve {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

struct EngineService::Live {
  std::shared_ptr<Job> job;
  size_t choice = 0;
  std::unique_ptr<TextStream> text;
  Clock::time_point last_emit;
  int64_t last_step = -1;
  bool emitted = false;
};

EngineService::EngineService(Model& model, const Tokenizer* tok, Metrics& metrics, ServiceOptions options)
    : model_(model), tok_(tok), metrics_(metrics), options_(options),
      engine_(model, EngineOptions{options.max_sequences}) {
  publish_load();
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() {
  {
    std::lock_guard lock(inbox_m_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  thread_.join();
}

void EngineService::submit(const std::shared_ptr<Job>& job) {
  job->out.assign(job->request.choices(), ChoiceOutput{});
  {
    std::lock_guard lock(inbox_m_);
    if (draining_ || stop_) throw ApiError(503, "the server is shutting down");
    const int64_t queued = engine_waiting_ + int64_t(inbox_.size());
    if (queued + int64_t(job->request.choices()) > options_.max_queue && queued > 0)
      throw ApiError(429, "the server's queue is full (" + std::to_string(queued) + " requests waiting, --max-queue " +
                              std::to_string(options_.max_queue) + "): retry later");
    inbox_.push_back(job);
    ++live_jobs_;
  }
  inbox_cv_.notify_all();
  std::unique_lock lock(job->m);
  job->cv.wait(lock, [&] { return job->state != Job::State::kQueued; });
  if (job->state == Job::State::kRefused) throw ApiError(400, job->refusal);
}

void EngineService::cancel(const std::shared_ptr<Job>& job) {
  if (job->cancelled.exchange(true)) return;
  {
    std::lock_guard lock(inbox_m_);
    cancels_.push_back(job);
  }
  inbox_cv_.notify_all();
}

void EngineService::begin_drain() { draining_ = true; }

void EngineService::wait_idle() {
  std::unique_lock lock(inbox_m_);
  idle_cv_.wait(lock, [&] { return live_jobs_ == 0; });
}

// The engine thread: takes new jobs and cancellations between steps, steps while anything is live.
void EngineService::loop() {
  std::vector<std::shared_ptr<Job>> arrived, cancelled;
  bool stopping = false;
  while (!(stopping && live_.empty())) {
    {
      std::unique_lock lock(inbox_m_);
      inbox_cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !engine_.idle(); });
      stopping = stop_;
      arrived.swap(inbox_);
      cancelled.swap(cancels_);
    }
    for (auto& job : arrived) {
      if (stopping)
        refuse(*job, "the server is shutting down");
      else
        start(job);
    }
    for (auto& job : cancelled)
      for (int64_t id : job->engine_ids) engine_.cancel(id);
    if (stopping)  // the destructor: what is left ends now (its HTTP threads see the jobs finish)
      for (auto& [id, live] : live_) live->job->cancelled = true, engine_.cancel(id);
    arrived.clear();
    cancelled.clear();
    if (!engine_.idle()) {
      ++step_;
      engine_.step();
    }
    for (auto& [id, result] : engine_.take_finished()) finish(id, result);
    publish_load();
  }
}

void EngineService::refuse(Job& job, const std::string& why) {
  {
    std::lock_guard lock(job.m);
    job.state = Job::State::kRefused;
    job.refusal = why;
  }
  job.cv.notify_all();
  std::lock_guard lock(inbox_m_);
  --live_jobs_;
  idle_cv_.notify_all();
}

// Submits the job's choices to the engine (choice j of a prompt samples with seed + j); a refusal ends the
// whole job with the engine's reason.
void EngineService::start(const std::shared_ptr<Job>& job) {
  const ApiRequest& r = job->request;
  try {
    for (size_t p = 0; p < r.prompts.size(); ++p) {
      for (int j = 0; j < r.n; ++j) {
        auto live = std::make_shared<Live>();
        live->job = job;
        live->choice = p * size_t(r.n) + size_t(j);
        live->text = std::make_unique<TextStream>(tok_, r.params.stop, r.params.min_tokens);
        Request req{r.prompts[p], r.params, r.spec, {}, r.format};
        req.params.seed = r.params.seed + uint64_t(j);
        req.params.logprobs = r.logprobs;
        Live* raw = live.get();
        req.on_token = [this, raw](int32_t t, const TokenLogprob* lp) { return on_token(*raw, t, lp); };
        const int64_t id = engine_.submit(std::move(req));
        job->engine_ids.push_back(id);
        live_[id] = live;
      }
    }
  } catch (const Error& e) {
    for (int64_t id : job->engine_ids) {  // (their results come back after the step, for no live choice)
      engine_.cancel(id);
      live_.erase(id);
    }
    refuse(*job, e.what());
    return;
  }
  {
    std::lock_guard lock(job->m);
    job->state = Job::State::kRunning;
  }
  job->cv.notify_all();
}

// Runs on the engine thread inside Engine::step for every emitted token.
bool EngineService::on_token(Live& live, int32_t token, const TokenLogprob* logprob) {
  Job& job = *live.job;
  const TextStream::Delta delta = live.text->has_tokenizer() ? live.text->push(token) : TextStream::Delta{};
  const auto now = Clock::now();
  {
    std::lock_guard lock(job.m);
    ChoiceOutput& c = job.out[live.choice];
    c.text += delta.text;
    c.ids.push_back(token);
    if (logprob) c.logprobs.push_back(*logprob);
    if (!live.emitted) c.time_to_first_token = seconds_between(job.arrival, now);
  }
  job.cv.notify_all();
  if (!live.emitted)
    metrics_.observe_first_token(seconds_between(job.arrival, now));
  else if (live.last_step != step_)  // one inter-token latency per step that emitted (as vLLM: per iteration)
    metrics_.observe_inter_token(seconds_between(live.last_emit, now));
  live.emitted = true;
  live.last_step = step_;
  live.last_emit = now;
  return !delta.stopped;  // (a cancelled job ends through Engine::cancel, before the next step: "abort")
}

void EngineService::finish(int64_t id, GenerationResult& result) {
  const auto it = live_.find(id);
  if (it == live_.end()) return;
  std::shared_ptr<Live> live = it->second;
  live_.erase(it);
  Job& job = *live->job;
  std::string tail;
  if (live->text->has_tokenizer() && result.finish_reason != "error") tail = live->text->finish();
  metrics_.observe_finished(result, seconds_between(job.arrival, Clock::now()));
  warn_if_drafts_broken(result.stats);
  bool job_done;
  {
    std::lock_guard lock(job.m);
    ChoiceOutput& c = job.out[live->choice];
    c.text += tail;
    c.finish_reason = result.finish_reason;
    c.error = result.error;
    c.stats = std::move(result.stats);
    ++job.finished;
    job_done = job.done();
  }
  job.cv.notify_all();
  if (job_done) {
    std::lock_guard lock(inbox_m_);
    --live_jobs_;
    idle_cv_.notify_all();
  }
}

// Once per server, over every request's drafts so far (broken MTP weights are broken from the start).
void EngineService::warn_if_drafts_broken(const SpecStats& stats) {
  if (drafts_warned_) return;
  draft_tokens_ += stats.num_draft_tokens;
  accepted_tokens_ += stats.num_accepted_tokens;
  const std::string w = broken_drafts_warning(draft_tokens_, accepted_tokens_);
  if (w.empty()) return;
  drafts_warned_ = true;
  std::fprintf(stderr, "%s\n", w.c_str());
}

void EngineService::publish_load() {
  metrics_.set_load(int64_t(engine_.active()), int64_t(engine_.waiting()), model_.kv_usage());
  // (the tuners' state is a few vectors: copied every so many steps, and whenever the engine goes idle)
  constexpr int64_t kTunerPublishSteps = 32;
  if (step_ % kTunerPublishSteps == 0 || engine_.idle()) metrics_.set_tuners(engine_.tuner_classes());
  std::lock_guard lock(inbox_m_);
  engine_waiting_ = int64_t(engine_.waiting());
}

}  // namespace nextn::serve
