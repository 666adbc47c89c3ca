// How many tokens a request may generate when it names no limit, and the error when it does not
// fit the context, for the HTTP and RPC servers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "util/str_cat.h"
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

// Why a prompt of prompt_tokens with max_tokens more does not fit a context of ctx tokens, in
// vLLM's words, which clients match to trim a conversation: the prompt alone, or the two
// together. input: what the prompt came as ("prompt" or "messages").
inline std::string ContextError(int64_t ctx, int64_t prompt_tokens, int64_t max_tokens,
                                std::string_view input) {
  if (prompt_tokens >= ctx) {
    return StrCat("This model's maximum context length is ", ctx,
                  " tokens. However, your request has ", prompt_tokens,
                  " input tokens. Please reduce the length of the input ", input, ".");
  }
  return StrCat("This model's maximum context length is ", ctx, " tokens. However, you requested ",
                prompt_tokens + max_tokens, " tokens (", prompt_tokens, " in the ", input, ", ",
                max_tokens, " in the completion). Please reduce the length of the ", input,
                " or completion.");
}

}  // namespace kvmesh::server
