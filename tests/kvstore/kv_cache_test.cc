#include "kvstore/kv_cache.h"

#include <gtest/gtest.h>

namespace kvmesh::kvstore {
namespace {

TEST(KvCache, GrowsOnDemandAndKeepsContents) {
  KvCache c(2, 3, 64, 1000);
  EXPECT_EQ(c.pos_stride(), 192);
  EXPECT_EQ(c.bytes_per_position(), 2 * 2 * 192 * 2);
  ASSERT_TRUE(c.Reserve(10).ok());
  EXPECT_GE(c.reserved(), 10);
  c.k(1)[9 * c.pos_stride() + 5] = 0x3c00;
  c.set_size(10);
  ASSERT_TRUE(c.Reserve(700).ok());
  EXPECT_GE(c.reserved(), 700);
  EXPECT_LE(c.reserved(), 1000);
  EXPECT_EQ(c.k(1)[9 * c.pos_stride() + 5], 0x3c00);
  EXPECT_EQ(c.size(), 10);
}

TEST(KvCache, RefusesToExceedItsCapacity) {
  KvCache c(1, 1, 8, 100);
  EXPECT_TRUE(c.Reserve(100).ok());
  const absl::Status s = c.Reserve(101);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(s.message()).find("exceed the context size 100"), std::string::npos);
}

}  // namespace
}  // namespace kvmesh::kvstore
