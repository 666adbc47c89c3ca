#include "server/rpc_frame.h"

#include "util/str_cat.h"

namespace kvmesh::server {

std::string EncodeFrame(const kvmesh::v1::Frame& frame) {
  std::string body;
  frame.SerializeToString(&body);
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + body;
}

absl::StatusOr<std::optional<kvmesh::v1::Frame>> FrameDecoder::Next() {
  if (buf_.size() - pos_ < 4) return std::nullopt;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(buf_[pos_ + i])) << (8 * i);
  if (n > max_) {
    return absl::InvalidArgumentError(
        StrCat("frame of ", n, " bytes exceeds the limit of ", max_, " bytes"));
  }
  if (buf_.size() - pos_ - 4 < n) return std::nullopt;
  kvmesh::v1::Frame f;
  if (!f.ParseFromArray(buf_.data() + pos_ + 4, static_cast<int>(n))) {
    return absl::InvalidArgumentError("frame bytes are not a kvmesh.v1.Frame");
  }
  pos_ += 4 + n;
  // Drop consumed bytes once they dominate the buffer.
  if (pos_ > 4096 && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return f;
}

}  // namespace kvmesh::server
