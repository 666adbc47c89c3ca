// How many tokens a request may generate when it names no limit, for the HTTP and RPC servers.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvmesh::server {

// What the context leaves after the prompt (vLLM's rule), within what the KV pool holds for the
// request alone (its K/V covers prompt + max_tokens - 1 positions), and at least 1: a prompt
// that fills either is refused later, with the reason.
inline int64_t DefaultMaxTokens(int64_t prompt_tokens, int64_t ctx, int64_t pool_tokens) {
  return std::max<int64_t>(1, std::min(ctx - prompt_tokens, pool_tokens - prompt_tokens + 1));
}

}  // namespace kvmesh::server
