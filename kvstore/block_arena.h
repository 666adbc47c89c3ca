// The KV blocks of one rank: a fixed number of equal blocks, each one contiguous byte range
// holding K and V of every layer this rank runs, for `block_size` token positions of its KV
// heads (fp16).
//
// Layout of a block: for each layer l, K then V. V is [block_size, n_kv_heads, head_dim]; K is
// transposed, [n_kv_heads, head_dim, block_size], so the keys of a block are contiguous per dim
// and attention computes q.k for 16 keys per vector instruction (kernels/ops.h).
// A block is one transfer, one checksum, one file extent; layer l of block b is reached with a
// per-layer base pointer plus b * block_stride(), so attention reads through a block table.
//
// Which block holds what is decided by the coordinator (kvstore::BlockManager); the arena is
// only storage. Memory is reserved up front (on huge pages where the kernel gives them:
// util/huge_pages.h) and committed as blocks are first written.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "util/huge_pages.h"

namespace kvmesh::kvstore {

// The geometry of one rank's blocks.
struct KvBlockShape {
  int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0, block_size = 16;
  // fp16 elements between consecutive positions of a layer's V inside a block (K: 1).
  int64_t pos_stride() const { return n_kv_heads * head_dim; }
  // Elements of one layer (K and V) of one block.
  int64_t layer_elems() const { return 2 * block_size * pos_stride(); }
  int64_t block_elems() const { return n_layers * layer_elems(); }
  int64_t block_bytes() const { return block_elems() * 2; }
  // KV bytes per token on this rank.
  int64_t bytes_per_token() const { return 2 * n_layers * pos_stride() * 2; }
};

class KvBlockArena {
 public:
  // InvalidArgument for a degenerate shape; ResourceExhausted if the memory cannot be mapped.
  static absl::StatusOr<std::unique_ptr<KvBlockArena>> Create(const KvBlockShape& shape,
                                                              int32_t n_blocks);
  KvBlockArena(const KvBlockArena&) = delete;
  KvBlockArena& operator=(const KvBlockArena&) = delete;

  const KvBlockShape& shape() const { return shape_; }
  int32_t n_blocks() const { return n_blocks_; }

  // Start of block b (block_elems() fp16 values).
  uint16_t* block(int32_t b) { return data() + b * shape_.block_elems(); }
  // Layer l's K (V) in block 0; block b's is at that + b * block_stride().
  uint16_t* k(int64_t l) { return data() + l * shape_.layer_elems(); }
  uint16_t* v(int64_t l) { return k(l) + shape_.block_size * shape_.pos_stride(); }
  int64_t block_stride() const { return shape_.block_elems(); }

  // Copies block src's contents over block dst (copy-on-write of a shared partial block).
  void CopyBlock(int32_t src, int32_t dst);

 private:
  KvBlockArena(const KvBlockShape& shape, int32_t n_blocks, util::HugePageRegion region)
      : shape_(shape), n_blocks_(n_blocks), region_(std::move(region)) {}
  uint16_t* data() const { return reinterpret_cast<uint16_t*>(region_.data()); }
  KvBlockShape shape_;
  int32_t n_blocks_;
  util::HugePageRegion region_;  // the blocks, one after another
};

}  // namespace kvmesh::kvstore
