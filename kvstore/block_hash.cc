#include "kvstore/block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <vector>

namespace kvmesh::kvstore {

BlockHash CacheSalt(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return {h.low64, h.high64};
}

BlockHash ChainHash(const BlockHash& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent.lo, sizeof(parent.lo));
  XXH3_128bits_update(&state, &parent.hi, sizeof(parent.hi));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

}  // namespace kvmesh::kvstore
