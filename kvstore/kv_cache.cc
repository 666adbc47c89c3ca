#include "kvstore/kv_cache.h"

#include <algorithm>

#include "util/str_cat.h"

namespace kvmesh::kvstore {

KvCache::KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_positions)
    : n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      max_positions_(max_positions),
      k_(n_layers),
      v_(n_layers) {}

absl::Status KvCache::Reserve(int64_t positions) {
  if (positions > max_positions_) {
    return absl::ResourceExhaustedError(
        StrCat("KV cache: ", positions, " positions exceed the context size ", max_positions_));
  }
  if (positions <= reserved_) return absl::OkStatus();
  // Grow geometrically (in 256-position steps) so decode does not reallocate per token.
  int64_t n = std::max<int64_t>(positions, std::min<int64_t>(max_positions_, reserved_ * 2));
  n = std::min<int64_t>(max_positions_, (n + 255) / 256 * 256);
  for (int64_t l = 0; l < n_layers_; ++l) {
    k_[l].resize(static_cast<size_t>(n * pos_stride()));
    v_[l].resize(static_cast<size_t>(n * pos_stride()));
  }
  reserved_ = n;
  return absl::OkStatus();
}

}  // namespace kvmesh::kvstore
