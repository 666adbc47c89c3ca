// util::AlignedVector, which the engine's activation buffers and the logits live in: its storage
// starts on a cache line whatever the size and however it grew (malloc alone gives 16 bytes).
#include "util/aligned_vector.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvmesh::util {
namespace {

bool OnALine(const void* p) { return reinterpret_cast<uintptr_t>(p) % kCacheLineBytes == 0; }

TEST(AlignedVector, StorageStartsOnACacheLine) {
  // Sizes below and above malloc's mmap threshold, of several element types, kept alive
  // together so that the allocator cannot hand the same block back each time.
  std::vector<AlignedVector<float>> floats;
  std::vector<AlignedVector<uint8_t>> bytes;
  for (size_t n : {1, 3, 17, 100, 1000, 4099, 70000, 1 << 20}) {
    floats.emplace_back(n, 1.0f);
    bytes.emplace_back(n + 5, uint8_t{7});
    EXPECT_TRUE(OnALine(floats.back().data())) << n << " floats";
    EXPECT_TRUE(OnALine(bytes.back().data())) << n + 5 << " bytes";
  }
  AlignedVector<float> grown;
  for (int i = 0; i < 5000; ++i) {
    grown.push_back(static_cast<float>(i));
    ASSERT_TRUE(OnALine(grown.data())) << "after " << i + 1 << " push_backs";
  }
  EXPECT_EQ(grown[4999], 4999.0f);
  grown.resize(3);
  grown.shrink_to_fit();
  EXPECT_TRUE(OnALine(grown.data()));
  EXPECT_EQ(grown[2], 2.0f);
}

}  // namespace
}  // namespace kvmesh::util
