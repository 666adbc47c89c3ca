// Block identities: a hash chain over a sequence's full blocks. Block i of a sequence is named
// hash(name of block i-1, its block_size token ids), and block 0's parent is a salt naming the
// model, the shard layout and the KV format, so equal names mean equal K/V bytes on every rank,
// tier and node. 128-bit XXH3: a collision would silently serve wrong K/V, so 64 bits of name
// space is not enough for a long-lived cluster-wide index.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvmesh::kvstore {

struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

// The root of every chain: hashes the text naming model id, layout and KV format.
BlockHash CacheSalt(std::string_view model_layout_format);

// The name of a full block whose parent is `parent` (the salt for block 0).
BlockHash ChainHash(const BlockHash& parent, std::span<const int32_t> tokens);

}  // namespace kvmesh::kvstore
