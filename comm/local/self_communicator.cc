#include "comm/communicator.h"
#include "util/str_cat.h"

namespace kvmesh::comm {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(std::span<float>) override { return absl::OkStatus(); }
  absl::Status AllReduceSum(std::span<uint16_t>, HalfType) override { return absl::OkStatus(); }
  absl::Status Broadcast(std::span<uint8_t>, int root) override {
    if (root != 0)
      return absl::InvalidArgumentError(StrCat("broadcast root ", root, " outside a 1-rank group"));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::Status Send(std::span<const float>, int dst, int) override {
    return absl::InvalidArgumentError("send: a 1-rank group has no peer " + std::to_string(dst));
  }
  absl::Status Recv(std::span<float>, int src, int) override {
    return absl::InvalidArgumentError("recv: a 1-rank group has no peer " + std::to_string(src));
  }
  absl::StatusOr<std::unique_ptr<PendingRecv>> RecvAsync(std::span<float>, int src, int) override {
    return absl::InvalidArgumentError("recv: a 1-rank group has no peer " + std::to_string(src));
  }
  absl::Status AllGather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() < mine.size()) return absl::InvalidArgumentError("all-gather: buffer too small");
    std::copy(mine.begin(), mine.end(), all.begin());
    return absl::OkStatus();
  }
  absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                       std::span<const int> counts, int root) override {
    if (root != 0 || counts.size() != 1 || counts[0] != static_cast<int>(mine.size()) ||
        all.size() < mine.size()) {
      return absl::InvalidArgumentError("gather: counts do not match a 1-rank group");
    }
    std::copy(mine.begin(), mine.end(), all.begin());
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Communicator> CreateSelfCommunicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace kvmesh::comm
