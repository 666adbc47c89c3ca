#include "kvstore/block_manager.h"

#include <cassert>

namespace kvmesh::kvstore {

BlockManager::BlockManager(int32_t n_blocks) : blocks_(n_blocks) {
  // Hand out low ids first (deterministic plans, compact arenas).
  for (BlockId b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  n_free_ = n_blocks;
}

std::optional<BlockId> BlockManager::Allocate() {
  BlockId b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
    --n_free_;
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    index_.erase(blocks_[b].hash);
    blocks_[b].named = false;
    ++evictions_;
  } else {
    return std::nullopt;
  }
  blocks_[b].refs = 1;
  return b;
}

void BlockManager::Acquire(BlockId b) {
  Block& k = blocks_[b];
  assert(k.refs > 0 || k.named);  // a free block is Allocate()d, not acquired
  if (k.refs == 0) lru_.erase(k.lru);
  ++k.refs;
}

void BlockManager::Release(BlockId b) {
  Block& k = blocks_[b];
  assert(k.refs > 0);
  if (--k.refs > 0) return;
  if (k.named) {
    k.lru = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
    ++n_free_;
  }
}

std::optional<BlockId> BlockManager::Find(const BlockHash& h) const {
  auto it = index_.find(h);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

bool BlockManager::Name(BlockId b, const BlockHash& h) {
  Block& k = blocks_[b];
  if (k.named || k.refs == 0) return false;
  if (!index_.try_emplace(h, b).second) return false;
  k.named = true;
  k.hash = h;
  return true;
}

bool BlockManager::Consistent() const {
  int32_t free = 0, cached = 0, named = 0;
  for (BlockId b = 0; b < n_blocks(); ++b) {
    const Block& k = blocks_[b];
    if (k.refs < 0) return false;
    if (k.named) {
      ++named;
      auto it = index_.find(k.hash);
      if (it == index_.end() || it->second != b) return false;
    }
    if (k.refs == 0 && k.named) ++cached;
    if (k.refs == 0 && !k.named) ++free;
  }
  return free == n_free_ && free == static_cast<int32_t>(free_.size()) &&
         cached == static_cast<int32_t>(lru_.size()) &&
         named == static_cast<int32_t>(index_.size());
}

}  // namespace kvmesh::kvstore
