// The OpenAI-compatible request and response bodies (JSON), as pure functions so they can be
// tested and fuzzed without a socket: /v1/completions and /v1/chat/completions requests in,
// completion objects, server-sent-event chunks and error objects out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/chat_template.h"
#include "model/sampler.h"

namespace kvmesh::server {

struct ApiLimits {
  int64_t vocab_size = 0;    // a prompt's token ids must be below it (0: any id >= 0)
  int32_t max_choices = 16;  // n's ceiling: each choice is a sequence of its own
};

// A parsed /v1/completions or /v1/chat/completions body.
struct ApiRequest {
  bool chat = false;
  int32_t n = 1;  // choices: n generations of the one prompt, choice i sampled with seed + i
  std::string model;
  std::string prompt;                        // completions: text,
  std::vector<int32_t> prompt_ids;           // or token ids (then `prompt` is empty)
  std::vector<model::ChatMessage> messages;  // chat
  // max_tokens (or max_completion_tokens), >= 1; not given: what the context leaves after the
  // prompt (vLLM's rule).
  std::optional<int32_t> max_tokens;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension, as vLLM
  std::string session_id;      // extension: continue a server-side session
  bool logprobs = false;       // report sampled tokens' log-probabilities
  int32_t top_logprobs = 0;    // and this many alternatives each (<= 20)
  model::SamplingParams sampling;
  // "stop": up to 4 strings; the text ends before the first one generated (not included).
  std::vector<std::string> stop;
};

// InvalidArgument naming the field for anything malformed or unsupported (n above
// max_choices or with a session, more than 20 logprobs, several prompts, unknown roles,
// out-of-range numbers, fields this server does not implement); the field is also the status's
// ParamOf.
absl::StatusOr<ApiRequest> ParseApiRequest(std::string_view body, bool chat,
                                           const ApiLimits& limits);
// The request field a ParseApiRequest error is about ("" if none): the error object's "param".
std::string ParamOf(const absl::Status& s);

// One generated token's log-probability, with its text and the top alternatives.
struct ApiLogprob {
  std::string token;  // a control token by its name (e.g. "<|im_end|>")
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
  // What it adds to the text, which text_offset counts: token's bytes, except none for a
  // control token (the text leaves it out). Null: token's.
  std::optional<std::string> text;
};

struct ApiUsage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  double engine_ttft_ms = -1;  // >= 0: reported as {"kvmesh": {"engine_ttft_ms": ...}}
};

// One choice of a response: its text, why it ended, and its tokens' logprobs (null: none asked).
struct ApiChoice {
  std::string text;
  std::string finish_reason;
  const std::vector<ApiLogprob>* logprobs = nullptr;
};

// The whole response of a non-streamed request: choice i has index i. usage counts the prompt
// once and the tokens of every choice.
std::string CompletionJson(const ApiRequest& req, const std::string& id, int64_t created,
                           const std::vector<ApiChoice>& choices, const ApiUsage& usage);
// One server-sent event ("data: {...}\n\n") carrying choice `index`'s `delta` (and
// finish_reason when non-empty); `first`: the choice's first chunk (a chat delta's role). A
// completion's logprobs count their text_offset from `text_offset` (the characters of the choice
// streamed before this chunk's tokens).
std::string StreamChunk(const ApiRequest& req, const std::string& id, int64_t created,
                        const std::string& delta, const std::string& finish_reason, bool first,
                        const std::vector<ApiLogprob>* logprobs = nullptr, size_t text_offset = 0,
                        int index = 0);
// The characters (UTF-8 code points, or parts of one) that text_offset counts for `token`.
size_t TextOffsetOf(std::string_view token);
// The final usage chunk of a stream with include_usage.
std::string StreamUsageChunk(const ApiRequest& req, const std::string& id, int64_t created,
                             const ApiUsage& usage);
// /v1/models ({"object": "list", "data": [model]}) or, with list false, /v1/models/{id} (the model
// object alone) for the one model served.
std::string ModelsJson(std::string_view name, int64_t max_model_len, bool list);
// {"error": {"message": ..., "type": ..., "param": ... (null if empty), "code": http_status}}
std::string ErrorJson(int http_status, std::string_view message, std::string_view param = {});

}  // namespace kvmesh::server
