#include "serve/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <future>
#include <random>
#include <thread>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/web_page.h"  // generated from src/serve/web/index.html

namespace nextn::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kJson = "application/json";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string request_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, (unsigned long long)rng(),
                (unsigned long long)(rng() & 0xffffffffu));
  return buf;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_body(e)), kJson);
}

template <class Json = json>
Json parse_body(const httplib::Request& req) {
  try {
    return Json::parse(req.body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

// What one stream has sent of each choice.
struct SentState {
  size_t text = 0, tokens = 0;
  int64_t text_offset = 0;  // completions logprobs: the offset of the next token's text
  bool started = false, ended = false;
};

// The chunk events the job's new output makes (under job.m). Advances `sent`.
void new_events(Job& job, const Tokenizer* tok, std::vector<SentState>& sent, std::vector<std::string>& events) {
  const ApiRequest& r = job.request;
  for (size_t i = 0; i < job.out.size(); ++i) {
    const ChoiceOutput& c = job.out[i];
    SentState& s = sent[i];
    const bool finishing = !c.finish_reason.empty() && !s.ended;
    if (c.text.size() == s.text && c.ids.size() == s.tokens && !finishing) continue;
    if (finishing && c.finish_reason == "error") {
      events.push_back(dump_json(error_body(ApiError(500, c.error))));
      s.ended = true;
      continue;
    }
    events.push_back(dump_json(stream_chunk(r, job.header, i, c.text.substr(s.text), c, s.tokens, c.ids.size(),
                                            s.text_offset, !s.started, finishing, tok)));
    for (size_t t = s.tokens; t < c.ids.size() && tok; ++t) s.text_offset += int64_t(tok->token_bytes(c.ids[t]).size());
    s.text = c.text.size();
    s.tokens = c.ids.size();
    s.started = true;
    s.ended |= finishing;
  }
}

// Writes the job's stream to the end: chunks as output arrives, the usage chunk if asked, then [DONE]. While
// nothing comes for 2 s (queued behind other requests), an SSE comment line keeps the connection checked: a
// client that went away makes a write fail, and that cancels its sequences. False: the client is gone.
bool stream_job(Job& job, const Tokenizer* tok, httplib::DataSink& sink) {
  std::vector<SentState> sent(job.out.size());
  auto last_write = Clock::now();
  for (;;) {
    std::vector<std::string> events;
    bool all_sent;
    {
      std::unique_lock lock(job.m);
      job.cv.wait_for(lock, 500ms, [&] {
        for (size_t i = 0; i < job.out.size(); ++i)
          if (job.out[i].text.size() != sent[i].text || job.out[i].ids.size() != sent[i].tokens ||
              (!job.out[i].finish_reason.empty() && !sent[i].ended))
            return true;
        return false;
      });
      new_events(job, tok, sent, events);
      all_sent = job.done();
      for (const SentState& s : sent) all_sent &= s.ended;
      if (all_sent && job.request.include_usage)
        events.push_back(dump_json(usage_chunk(job.request, job.header, job.out, job.prompt_tokens)));
    }
    for (const std::string& e : events)
      if (!write_event(sink, e)) return false;
    const auto now = Clock::now();
    if (!events.empty()) last_write = now;
    if (all_sent) {
      if (!write_event(sink, "[DONE]")) return false;
      sink.done();
      return true;
    }
    if (events.empty() && now - last_write > 2s) {
      static const char kComment[] = ": waiting\n\n";
      if (!sink.write(kComment, sizeof kComment - 1)) return false;
      last_write = now;
    }
  }
}

class Routes {
 public:
  Routes(const ServedModel& model, EngineService& service, Metrics& metrics)
      : model_(model), service_(service), metrics_(metrics), started_(unix_now()) {}

  void install(httplib::Server& svr) {
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { guarded(s, [&] { generate(q, s, false); }); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { guarded(s, [&] { generate(q, s, true); }); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) { s.set_content(dump_json(models()), kJson); });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      const std::string failure = service_.model_failure();
      if (service_.draining() || !failure.empty()) s.status = 503;
      s.set_content(!failure.empty()      ? dump_json({{"status", "failed"}, {"error", failure}})
                    : service_.draining() ? R"({"status":"draining"})"
                                          : R"({"status":"ok"})",
                    kJson);
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      s.set_content(metrics_.render(), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/", [](const httplib::Request&, httplib::Response& s) {
      s.set_content(std::string(web::kPage), "text/html; charset=utf-8");
    });
  }

 private:
  template <class F>
  void guarded(httplib::Response& res, F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
  }

  json models() const {
    return {{"object", "list"},
            {"data", json::array({{{"id", model_.id},
                                   {"object", "model"},
                                   {"created", started_},
                                   {"owned_by", "nextn"},
                                   {"root", model_.facts->dir},
                                   {"max_model_len", model_.facts->context}}})}};
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    if (service_.draining()) throw ApiError(503, "the server is shutting down");
    auto job = std::make_shared<Job>();
    // Parsed once, in the key order the client sent (the template renders maps in that order, as transformers
    // does, and a response_format schema's properties come out in it); the fields are read from a copy.
    const auto ordered = parse_body<nlohmann::ordered_json>(req);
    job->request = chat ? parse_chat_request(json(ordered), model_, &ordered)
                        : parse_completion_request(json(ordered), model_, &ordered);
    job->header = {request_id(chat ? "chatcmpl-" : "cmpl-"), unix_now(), model_.id};
    for (const auto& p : job->request.prompts) job->prompt_tokens += int64_t(p.size());
    service_.submit(job);
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      const Tokenizer* tok = model_.tokenizer;
      EngineService* service = &service_;
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, tok](size_t, httplib::DataSink& sink) { return stream_job(*job, tok, sink); },
          [job, service](bool success) {
            if (!success) service->cancel(job);
          });
      return;
    }
    std::unique_lock lock(job->m);
    job->cv.wait(lock, [&] { return job->done(); });
    for (const ChoiceOutput& c : job->out)
      if (c.finish_reason == "error") throw ApiError(500, c.error);
    res.set_content(dump_json(final_response(job->request, job->header, job->out, job->prompt_tokens, model_.tokenizer)),
                    kJson);
  }

  const ServedModel& model_;
  EngineService& service_;
  Metrics& metrics_;
  int64_t started_;
};

// A status the routes did not answer (unknown path, 413 from the body limit, a malformed request line):
// OpenAI's error body instead of an empty one.
httplib::Server::HandlerResponse answer_error(const httplib::Request& req, httplib::Response& res, size_t max_body) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  std::string message = "HTTP " + std::to_string(res.status);
  if (res.status == 404) message = "no such endpoint: " + req.method + " " + req.path;
  if (res.status == 413) message = "the request body is larger than the server accepts (" + std::to_string(max_body) +
                                   " bytes, --max-body-kb)";
  if (res.status == 400) message = "malformed HTTP request";
  res.set_content(dump_json(error_body(ApiError(res.status, message))), kJson);
  return httplib::Server::HandlerResponse::Handled;
}

// Waits for SIGINT / SIGTERM; the first drains and stops the server, a second exits at once.
struct Shutdown {
  std::atomic<bool> requested{false};
  std::promise<void> stopped;  // set once svr.stop() has returned
};

void watch_signals(httplib::Server* svr, EngineService* service, std::shared_ptr<Shutdown> shutdown) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "nextn serve: %s: finishing the requests in flight, then exiting\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  shutdown->requested = true;
  service->begin_drain();
  std::thread([svr, service, shutdown] {
    service->wait_idle();
    svr->stop();
    shutdown->stopped.set_value();
  }).detach();
  sigwait(&set, &sig);
  std::fprintf(stderr, "nextn serve: second signal: exiting now\n");
  std::_Exit(130);
}

}  // namespace

void block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

namespace {

// Debian's libcpp-httplib is compiled with a listen backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed in the
// library): a burst of new connections past it waits for SYN retransmits (1 s, then 3 s) or is reset, as 64
// clients connecting at once were. listen() again on the bound socket raises the backlog to the system's cap.
void widen_listen_backlog(int port) {
  for (int fd = 0; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    const int bound = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                      : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                                   : -1;
    if (bound == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace

int serve_http(const ServedModel& model, EngineService& service, Metrics& metrics, const HttpOptions& o) {
  httplib::Server svr;
  const size_t threads = size_t(std::max(4, o.http_threads));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(o.max_body_bytes);
  svr.set_keep_alive_max_count(1000);
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [&o](const httplib::Request& q, httplib::Response& s) { return answer_error(q, s, o.max_body_bytes); }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& s, std::exception_ptr) {
    send_error(s, ApiError(500, "internal error"));
  });
  Routes routes(model, service, metrics);
  routes.install(svr);

  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) throw Error("nextn serve: cannot listen on " + o.host + " (any port)");
  } else if (!svr.bind_to_port(o.host, port)) {
    throw Error("nextn serve: cannot listen on " + o.host + ":" + std::to_string(port) +
                " (in use, or not an address of this machine): choose another --port or --host");
  }
  widen_listen_backlog(port);
  auto shutdown = std::make_shared<Shutdown>();
  std::future<void> stopped = shutdown->stopped.get_future();
  // (The watcher stays blocked in sigwait until a signal, which ends the process or this function.)
  std::thread(watch_signals, &svr, &service, shutdown).detach();
  std::fprintf(stderr, "nextn serve: listening on http://%s:%d (model %s)\n", o.host.c_str(), port, model.id.c_str());
  const bool ok = svr.listen_after_bind();
  if (shutdown->requested) stopped.wait();  // svr outlives the drainer's stop()
  std::fprintf(stderr, "nextn serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace nextn::serve
