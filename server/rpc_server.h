// The cluster RPC server (kvmesh.v1 over TCP, Boost.Asio): length-prefixed Protobuf frames
// (server/rpc_frame.h) with a request id for multiplexing and cancellation. Requests: Generate
// and Chat (streamed Token frames, then Done), server-side sessions (open / append / close),
// Tokenize, ClusterStatus, CacheStats, Health. With an API key the first frame must be Auth.
// Per connection: frames up to max_frame_bytes, at most max_in_flight generations and tokenize
// requests; a protocol error is answered with an Error frame and the connection closes; the
// server keeps serving.
// Runs on its own io thread, feeding the same EngineLoop as the HTTP server.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine_loop.h"
#include "worker/engine.h"

namespace kvmesh::server {

struct RpcOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8001;  // 0: any free port
  std::string api_key;
  size_t max_frame_bytes = 4 << 20;
  int max_in_flight = 64;
  // A frame begun and not completed within this (no other frame completing meanwhile) fails
  // its connection (as the HTTP server's read timeout): a slow or stalled client cannot hold a
  // partial frame's buffer forever. So does a write of a reply frame that does not complete
  // within it (as the HTTP server's write timeout): the connection's requests are cancelled.
  std::chrono::seconds frame_timeout{60};
  // The layout for ClusterStatus.
  int world = 1, tp = 1, pp = 1, dp = 1;
  std::string model_name = "smollm2-135m-instruct";
};

class RpcServer {
 public:
  // Binds, listens and starts the io thread; Unavailable naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<RpcServer>> Start(const RpcOptions& opts, EngineLoop& loop,
                                                          const worker::Engine& engine);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;
  uint16_t port() const;
  // Stops accepting, closes connections once their streams end (at most 5 s), joins.
  void Shutdown();

  struct Impl;

 private:
  explicit RpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::server
