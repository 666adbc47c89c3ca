// The KV cache of one sequence on one rank: for every layer, K and V of the rank's KV heads as
// fp16 [positions, n_kv_heads, head_dim], growing on demand up to a fixed capacity.
//
// This is the single-sequence cache of the foundation engine; the paged, shared block pool
// replaces its storage later without changing what attention reads (a position stride and a
// base pointer per layer). Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kvmesh::kvstore {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_positions);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Makes room for `positions` positions. ResourceExhausted if that exceeds the capacity.
  absl::Status Reserve(int64_t positions);

  // Base of layer l's K / V; position p of kv head h is at + p * pos_stride() + h * head_dim.
  uint16_t* k(int64_t layer) { return k_[layer].data(); }
  uint16_t* v(int64_t layer) { return v_[layer].data(); }
  int64_t pos_stride() const { return n_kv_heads_ * head_dim_; }

  // Positions holding valid K/V (the next token goes at size()).
  int64_t size() const { return size_; }
  void set_size(int64_t n) { size_ = n; }
  int64_t capacity() const { return max_positions_; }
  int64_t reserved() const { return reserved_; }
  // Bytes of K and V per position, all layers.
  int64_t bytes_per_position() const { return 2 * n_layers_ * pos_stride() * 2; }

 private:
  int64_t n_layers_, n_kv_heads_, head_dim_, max_positions_;
  int64_t reserved_ = 0, size_ = 0;
  std::vector<std::vector<uint16_t>> k_, v_;
};

}  // namespace kvmesh::kvstore
