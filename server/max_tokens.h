// How many tokens a request may generate when it names no limit, for the HTTP and RPC servers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "worker/engine.h"

namespace kvmesh::server {

// What the context leaves after the prompt (vLLM's rule), within what the KV pool holds for the
// request alone (its K/V covers prompt + max_tokens - 1 positions), and at least 1: a prompt
// that fills either is refused later, with the reason.
inline int64_t DefaultMaxTokens(const worker::Engine& engine, int64_t prompt_tokens) {
  const int64_t pool_tokens = int64_t{engine.n_blocks()} * engine.block_size();
  return std::max<int64_t>(
      1, std::min(engine.ctx_size() - prompt_tokens, pool_tokens - prompt_tokens + 1));
}

}  // namespace kvmesh::server
