#include "kvstore/block_arena.h"

#include <cstring>
#include <utility>

#include "util/str_cat.h"

namespace kvmesh::kvstore {

absl::StatusOr<std::unique_ptr<KvBlockArena>> KvBlockArena::Create(const KvBlockShape& shape,
                                                                   int32_t n_blocks) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0 || n_blocks <= 0) {
    return absl::InvalidArgumentError(StrCat("KV arena: bad shape (layers ", shape.n_layers,
                                             ", kv heads ", shape.n_kv_heads, ", head dim ",
                                             shape.head_dim, ", block size ", shape.block_size,
                                             ", blocks ", n_blocks, ")"));
  }
  const size_t bytes = static_cast<size_t>(shape.block_bytes()) * static_cast<size_t>(n_blocks);
  // Anonymous pages: reserved now, committed (zeroed) by the kernel when first written, so
  // resident memory follows the blocks actually used rather than the budget (blocks are handed
  // out from the low end: BlockManager).
  util::HugePageRegion region = util::HugePageRegion::Map(bytes);
  if (region.data() == nullptr) {
    return absl::ResourceExhaustedError(
        StrCat("KV arena: cannot map ", bytes >> 20, " MiB for ", n_blocks, " blocks"));
  }
  return std::unique_ptr<KvBlockArena>(new KvBlockArena(shape, n_blocks, std::move(region)));
}

void KvBlockArena::CopyBlock(int32_t src, int32_t dst) {
  std::memcpy(block(dst), block(src), static_cast<size_t>(shape_.block_bytes()));
}

}  // namespace kvmesh::kvstore
