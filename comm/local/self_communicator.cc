#include "comm/communicator.h"
#include "util/str_cat.h"

namespace kvmesh::comm {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(std::span<float>) override { return absl::OkStatus(); }
  absl::Status Broadcast(std::span<uint8_t>, int root) override {
    if (root != 0)
      return absl::InvalidArgumentError(StrCat("broadcast root ", root, " outside a 1-rank group"));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> CreateSelfCommunicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace kvmesh::comm
