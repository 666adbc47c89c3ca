#include <gtest/gtest.h>

#include <vector>

#include "comm/communicator.h"

namespace kvmesh::comm {
namespace {

TEST(SelfCommunicator, IsAOneRankGroup) {
  auto c = CreateSelfCommunicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> v{1.5f, -2.0f};
  ASSERT_TRUE(c->AllReduceSum(v).ok());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  std::vector<uint8_t> b{1, 2, 3};
  EXPECT_TRUE(c->Broadcast(b, 0).ok());
  EXPECT_EQ(c->Broadcast(b, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->Barrier().ok());
}

}  // namespace
}  // namespace kvmesh::comm
