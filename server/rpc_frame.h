// The cluster RPC wire format: each kvmesh.v1.Frame is sent as a 4-byte little-endian length
// followed by that many bytes of the serialized message. Frames longer than the limit are a
// protocol error (the connection is closed), so a peer cannot make the other side buffer
// unbounded input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kvmesh.pb.h"

namespace kvmesh::server {

constexpr size_t kDefaultMaxFrameBytes = 4 << 20;

std::string EncodeFrame(const kvmesh::v1::Frame& frame);

// Incremental decoder for one connection's byte stream. Thread-compatible.
class FrameDecoder {
 public:
  explicit FrameDecoder(size_t max_frame_bytes = kDefaultMaxFrameBytes) : max_(max_frame_bytes) {}
  // Appends received bytes.
  void Feed(const char* data, size_t n) { buf_.append(data, n); }
  // The next complete frame, nullopt if more bytes are needed, or InvalidArgument (a length
  // over the limit, or bytes that are not a Frame): the stream is then unusable.
  absl::StatusOr<std::optional<kvmesh::v1::Frame>> Next();
  size_t buffered() const { return buf_.size() - pos_; }
  // The largest frame accepted from now on.
  void set_max_frame_bytes(size_t max) { max_ = max; }

 private:
  size_t max_;
  std::string buf_;
  size_t pos_ = 0;
};

}  // namespace kvmesh::server
