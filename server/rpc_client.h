// A blocking C++ client of the cluster RPC API (kvmesh.v1). One request at a time per client;
// streamed replies are delivered to a callback. Not thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvmesh.pb.h"

namespace kvmesh::server {

class RpcClient {
 public:
  // Connects (and authenticates when api_key is non-empty). Unavailable if it cannot connect.
  static absl::StatusOr<std::unique_ptr<RpcClient>> Connect(const std::string& host, uint16_t port,
                                                            const std::string& api_key);
  ~RpcClient();

  // Sends a request frame (its request_id is assigned here) and returns the reply frame; an
  // Error frame becomes a status with its code and message.
  absl::StatusOr<kvmesh::v1::Frame> Call(kvmesh::v1::Frame request);
  // The same for a streamed request (Generate, SessionAppend): on_token sees each Token frame;
  // returns the final Done. Returning false from on_token cancels the request (Done then says
  // "cancelled").
  absl::StatusOr<kvmesh::v1::Done> Stream(
      kvmesh::v1::Frame request, const std::function<bool(const kvmesh::v1::Token&)>& on_token);
  // Several streamed requests in flight at once (each its own request_id, assigned here, all sent
  // before any reply is read): on_token(i, token) sees request i's Token frames as they come,
  // interleaved; returns their Done frames in request order. Returning false from on_token
  // cancels request i. An Error frame for any of them ends the call with its status (closing the
  // client then cancels the others on the server).
  absl::StatusOr<std::vector<kvmesh::v1::Done>> StreamAll(
      std::vector<kvmesh::v1::Frame> requests,
      const std::function<bool(size_t, const kvmesh::v1::Token&)>& on_token);

  struct Impl;

 private:
  explicit RpcClient(std::unique_ptr<Impl> impl);
  absl::StatusOr<kvmesh::v1::Frame> Receive();
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh::server
