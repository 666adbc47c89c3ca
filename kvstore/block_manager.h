// The coordinator's view of a KV block pool: which blocks are free, how many sequences
// reference each, and which full blocks are named (prefix cache) so later requests can share
// them. It decides; every rank's KvBlockArena stores. Identical decisions on every rank of a TP
// group follow from block ids travelling in the step plan.
//
// A block is in one of three states:
//   referenced  ref count > 0 (part of a running sequence's or a session's block table);
//   cached      ref count 0 but named: kept for reuse, evicted least recently released first;
//   free        ref count 0, unnamed.
// Allocate() takes a free block, else evicts the least recently released cached one. Releasing a
// finished sequence's blocks from its tail to its head makes its tail the first to be evicted.
// A named block is never written again (only full blocks are named); a partially filled block
// that more than one table references is copied before it is written (the caller checks
// ref_count() and plans the copy).
//
// Thread-compatible (the scheduler's thread owns it).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvstore/block_hash.h"

namespace kvmesh::kvstore {

using BlockId = int32_t;

class BlockManager {
 public:
  explicit BlockManager(int32_t n_blocks);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t n_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Blocks Allocate() can still hand out (free + cached).
  int32_t available() const { return n_free_ + static_cast<int32_t>(lru_.size()); }
  int32_t referenced() const { return n_blocks() - available(); }
  int32_t cached() const { return static_cast<int32_t>(lru_.size()); }
  // Blocks holding nothing (never named, or dropped): referenced + cached + unused = n_blocks.
  int32_t unused() const { return n_free_; }
  int64_t evictions() const { return evictions_; }

  // A block with ref count 1 and no name, or nullopt when every block is referenced.
  std::optional<BlockId> Allocate();
  // Adds a reference (a cached block becomes referenced again: a prefix-cache hit).
  void Acquire(BlockId b);
  // Drops a reference; at zero a named block becomes cached (most recently released), an
  // unnamed one free.
  void Release(BlockId b);
  int32_t ref_count(BlockId b) const { return blocks_[b].refs; }

  // The block named `h`, if one is referenced or cached.
  std::optional<BlockId> Find(const BlockHash& h) const;
  // Names a full, referenced block. Returns false (and leaves it unnamed) if another block
  // already has the name (two sequences computed the same prefix at once) or it is named.
  bool Name(BlockId b, const BlockHash& h);

  // Checks the internal invariants (counts, LRU membership, index); for tests.
  bool Consistent() const;

 private:
  struct Block {
    int32_t refs = 0;
    bool named = false;
    BlockHash hash;
    std::list<BlockId>::iterator lru;  // valid while cached
  };
  std::vector<Block> blocks_;
  std::vector<BlockId> free_;  // stack of free blocks
  int32_t n_free_ = 0;
  std::list<BlockId> lru_;  // cached blocks, least recently released first
  absl::flat_hash_map<BlockHash, BlockId> index_;
  int64_t evictions_ = 0;
};

}  // namespace kvmesh::kvstore
