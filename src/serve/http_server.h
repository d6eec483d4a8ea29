// `nextn serve`'s HTTP side (cpp-httplib): the OpenAI routes, /metrics, /health, the chat page, SSE streaming,
// OpenAI-style errors for every failure, and a drain on SIGINT / SIGTERM.
#pragma once
#include <cstddef>
#include <string>

#include "serve/engine_service.h"
#include "serve/metrics.h"
#include "serve/openai_request.h"

namespace nextn::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (the ready line says which)
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  int http_threads = 128;           // connections served at once (each stream holds one)
};

// Serves until SIGINT or SIGTERM, then drains: new requests get 503, live ones finish, and it returns 0.
// Prints "nextn serve: listening on http://HOST:PORT (model ID)" on stderr once it accepts connections.
// The caller must have blocked SIGINT and SIGTERM in every thread (block_shutdown_signals) before starting any.
int serve_http(const ServedModel& model, EngineService& service, Metrics& metrics, const HttpOptions& options);

// Blocks SIGINT and SIGTERM in the calling thread and in every thread it starts afterwards (serve_http takes
// them with sigwait), and ignores SIGPIPE (a client that went away is an error return, not a signal).
void block_shutdown_signals();

}  // namespace nextn::serve
