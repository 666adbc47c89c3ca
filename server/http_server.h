// The OpenAI-compatible HTTP server (Boost.Beast) in front of an EngineLoop:
//   POST /v1/completions, POST /v1/chat/completions ("stream": true -> server-sent events),
//   GET /v1/models, GET /health, GET /metrics (Prometheus text).
// One io thread serves every connection; generation runs on the engine loop's thread and its
// callbacks are posted back to the connection. Binds 127.0.0.1 unless told otherwise. With an
// API key, every route but /health needs `Authorization: Bearer <key>` (compared in constant
// time). Bodies are capped, malformed requests get a 4xx and the connection closes; a full
// queue is answered 429 at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine_loop.h"
#include "worker/engine.h"

namespace kvmesh::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port)
  std::string api_key;   // empty: no authentication
  size_t max_body_bytes = 2 << 20;
  size_t max_header_bytes = 16 << 10;
  // Seconds a client may take to send a request, and to take each write of a response; past it
  // the connection closes and its generation is cancelled (a client that stops reading would
  // otherwise hold its sequence, its KV blocks and its connection for good).
  std::chrono::seconds timeout{60};
  std::string model_name = "smollm2-135m-instruct";
  // n's ceiling (choices of one prompt), at most what the waiting queue takes at once.
  int32_t max_choices = 16;
};

class HttpServer {
 public:
  // Binds, listens and starts the io thread. Unavailable naming the address if it cannot bind.
  // `loop` and `engine` (for the tokenizer, chat template and context size) must outlive it.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpOptions& opts,
                                                           EngineLoop& loop,
                                                           const worker::Engine& engine);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // Calls `fn` (on the io thread) when SIGTERM or SIGINT arrives.
  void OnSignal(std::function<void()> fn);
  // Stops accepting, closes idle connections, lets in-flight responses finish (up to 5 s) and
  // joins the io thread. Call after the engine loop has drained.
  void Shutdown();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::server
