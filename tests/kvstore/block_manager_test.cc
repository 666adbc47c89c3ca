#include "kvstore/block_manager.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "kvstore/block_arena.h"
#include "kvstore/block_hash.h"

namespace kvmesh::kvstore {
namespace {

BlockHash Name(int i) { return ChainHash(CacheSalt("test"), std::vector<int32_t>{i}); }

TEST(BlockHash, ChainsDependOnParentTokensAndSalt) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const BlockHash s1 = CacheSalt("model=x;tp=1"), s2 = CacheSalt("model=x;tp=2");
  EXPECT_EQ(ChainHash(s1, a), ChainHash(s1, a));
  EXPECT_NE(ChainHash(s1, a), ChainHash(s1, b));
  EXPECT_NE(ChainHash(s1, a), ChainHash(s2, a));
  EXPECT_NE(ChainHash(ChainHash(s1, a), b), ChainHash(ChainHash(s1, b), b));
  // Token ids are hashed as whole int32s: no two token lists share bytes by concatenation.
  EXPECT_NE(ChainHash(s1, std::vector<int32_t>{256}), ChainHash(s1, std::vector<int32_t>{1}));
}

TEST(BlockManager, AllocatesEveryBlockOnceThenRefuses) {
  BlockManager m(4);
  std::set<BlockId> got;
  for (int i = 0; i < 4; ++i) {
    auto b = m.Allocate();
    ASSERT_TRUE(b.has_value());
    got.insert(*b);
    EXPECT_EQ(m.ref_count(*b), 1);
  }
  EXPECT_EQ(got.size(), 4u);
  EXPECT_FALSE(m.Allocate().has_value());
  EXPECT_EQ(m.available(), 0);
  EXPECT_EQ(m.referenced(), 4);
  for (BlockId b : got) m.Release(b);
  EXPECT_EQ(m.available(), 4);
  EXPECT_EQ(m.cached(), 0);  // unnamed blocks go straight back to the free list
  EXPECT_TRUE(m.Consistent());
}

TEST(BlockManager, NamedBlocksAreCachedFoundAndReacquired) {
  BlockManager m(3);
  const BlockId b = *m.Allocate();
  ASSERT_TRUE(m.Name(b, Name(1)));
  EXPECT_FALSE(m.Name(b, Name(2)));  // already named
  const BlockId other = *m.Allocate();
  EXPECT_FALSE(m.Name(other, Name(1)));  // name taken: stays unnamed
  m.Release(other);
  m.Acquire(b);
  EXPECT_EQ(m.ref_count(b), 2);
  m.Release(b);
  m.Release(b);
  EXPECT_EQ(m.cached(), 1);
  EXPECT_EQ(m.available(), 3);
  ASSERT_EQ(m.Find(Name(1)), b);
  m.Acquire(b);  // a prefix-cache hit
  EXPECT_EQ(m.cached(), 0);
  EXPECT_EQ(m.referenced(), 1);
  m.Release(b);
  EXPECT_TRUE(m.Consistent());
}

TEST(BlockManager, EvictsLeastRecentlyReleasedFirstAndOnlyWhenNothingIsFree) {
  BlockManager m(3);
  const BlockId a = *m.Allocate(), b = *m.Allocate(), c = *m.Allocate();
  m.Name(a, Name(1));
  m.Name(b, Name(2));
  m.Name(c, Name(3));
  // A finished sequence releases its tail first: c, then b, then a.
  m.Release(c);
  m.Release(b);
  m.Release(a);
  EXPECT_EQ(m.cached(), 3);
  EXPECT_EQ(*m.Allocate(), c);  // the tail goes first
  EXPECT_FALSE(m.Find(Name(3)).has_value());
  EXPECT_EQ(*m.Allocate(), b);
  EXPECT_EQ(m.Find(Name(1)), a);  // the head of the prefix survives longest
  EXPECT_EQ(m.evictions(), 2);
  EXPECT_TRUE(m.Consistent());
}

TEST(BlockManager, RandomOperationsKeepTheInvariants) {
  BlockManager m(32);
  std::mt19937 rng(7);
  std::vector<BlockId> held;
  int next_name = 0;
  for (int step = 0; step < 20000; ++step) {
    const int op = rng() % 4;
    if (op == 0) {
      if (auto b = m.Allocate()) held.push_back(*b);
    } else if (op == 1 && !held.empty()) {
      const size_t i = rng() % held.size();
      m.Release(held[i]);
      held.erase(held.begin() + i);
    } else if (op == 2 && !held.empty()) {
      m.Name(held[rng() % held.size()], Name(next_name++ % 50));
    } else if (op == 3) {
      if (auto b = m.Find(Name(rng() % 50))) {
        m.Acquire(*b);
        held.push_back(*b);
      }
    }
    ASSERT_EQ(m.referenced(),
              static_cast<int32_t>(std::set<BlockId>(held.begin(), held.end()).size()));
    if (step % 97 == 0) {
      ASSERT_TRUE(m.Consistent());
    }
  }
  for (BlockId b : held) m.Release(b);
  EXPECT_EQ(m.referenced(), 0);
  EXPECT_TRUE(m.Consistent());
}

TEST(KvBlockArena, BlocksAreContiguousAndCopyable) {
  const KvBlockShape shape{3, 2, 8, 4};
  auto a = KvBlockArena::Create(shape, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  KvBlockArena& arena = **a;
  EXPECT_EQ(shape.block_bytes(), 3 * 2 * 4 * 2 * 8 * 2);
  // Layer views of block b lie inside block b's byte range.
  for (int64_t l = 0; l < 3; ++l) {
    uint16_t* k = arena.k(l) + 2 * arena.block_stride();
    uint16_t* v = arena.v(l) + 2 * arena.block_stride();
    EXPECT_GE(k, arena.block(2));
    EXPECT_LT(v + shape.block_size * shape.pos_stride() - 1, arena.block(3));
    k[0] = static_cast<uint16_t>(100 + l);
  }
  arena.CopyBlock(2, 4);
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(arena.k(l)[4 * arena.block_stride()], 100 + l);
  EXPECT_FALSE(KvBlockArena::Create({0, 2, 8, 4}, 5).ok());
  EXPECT_FALSE(KvBlockArena::Create(shape, 0).ok());
}

}  // namespace
}  // namespace kvmesh::kvstore
