#include "server/openai_api.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "util/random_seed.h"
#include "util/str_cat.h"
#include "util/utf8.h"

namespace kvmesh::server {

using nlohmann::json;

namespace {

// The payload of a request error that names its field (ParamOf).
constexpr char kParamUrl[] = "kvmesh.dev/openai-param";

absl::Status Bad(std::string_view field, std::string_view why) {
  absl::Status s = absl::InvalidArgumentError(StrCat("'", field, "' ", why));
  s.SetPayload(kParamUrl, absl::Cord(std::string(field)));
  return s;
}

// Reads an optional number field within [lo, hi].
template <typename T>
absl::Status Number(const json& j, const char* field, double lo, double hi, T& out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(field, "must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) return Bad(field, StrCat("must be in [", lo, ", ", hi, "]"));
  if (std::is_integral_v<T> && v != static_cast<double>(static_cast<int64_t>(v))) {
    return Bad(field, "must be an integer");
  }
  out = static_cast<T>(v);
  return absl::OkStatus();
}

absl::Status Bool(const json& j, const char* field, bool& out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Bad(field, "must be a boolean");
  out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status String(const json& j, const char* field, std::string& out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Bad(field, "must be a string");
  out = it->get<std::string>();
  return absl::OkStatus();
}

json Usage(const ApiUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// A token as completions' logprobs name it: its text, or where that is not whole UTF-8 (a byte
// of a character split over tokens) "bytes:" and each byte as \xHH, as OpenAI's legacy API
// does. As text such tokens all became U+FFFD, so a top_logprobs object had one key for all.
std::string TokenKey(const std::string& token) {
  if (ValidUtf8(token) == token) return token;
  std::string key = "bytes:";
  constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : token) key += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
  return key;
}

// OpenAI's logprobs object: {"content": [...]} for chat, parallel arrays for completions (their
// text_offset counted on from `offset`).
json LogprobsJson(const ApiRequest& req, const std::vector<ApiLogprob>& lps, size_t offset = 0) {
  if (req.chat) {
    json content = json::array();
    for (const ApiLogprob& lp : lps) {
      json top = json::array();
      for (size_t i = 0; i < lp.top.size() && i < static_cast<size_t>(req.top_logprobs); ++i) {
        top.push_back({{"token", lp.top[i].first},
                       {"logprob", lp.top[i].second},
                       {"bytes", Bytes(lp.top[i].first)}});
      }
      content.push_back({{"token", lp.token},
                         {"logprob", lp.logprob},
                         {"bytes", Bytes(lp.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const ApiLogprob& lp : lps) {
    tokens.push_back(TokenKey(lp.token));
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (size_t i = 0; i < lp.top.size() && i < static_cast<size_t>(req.top_logprobs); ++i) {
      top[TokenKey(lp.top[i].first)] = lp.top[i].second;
    }
    tops.push_back(top);
    offsets.push_back(offset);
    offset += TextOffsetOf(lp.text.value_or(lp.token));
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// Bodies may nest arrays and objects this deep (OpenAI's requests need 4: a message's content
// parts). The JSON library parses and frees without recursion but copies and compares
// recursively, so a deeper body (a megabyte of '[') could overflow the io thread's stack.
constexpr int kMaxJsonDepth = 64;

// Whether `text` nests arrays and objects deeper than `limit`, brackets in strings not counted.
// A scan, not a validation: the parser judges the rest.
bool NestsDeeperThan(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}
}  // namespace

namespace {
absl::StatusOr<ApiRequest> Parse(std::string_view body, bool chat, const ApiLimits& limits);
}  // namespace

std::string ParamOf(const absl::Status& s) {
  const auto p = s.GetPayload(kParamUrl);  // absl::optional<absl::Cord>
  return p ? std::string(*p) : std::string();
}

size_t TextOffsetOf(std::string_view token) {
  size_t n = 0;
  for (unsigned char c : token) n += (c & 0xC0) != 0x80;  // not a continuation byte
  return n;
}

absl::StatusOr<ApiRequest> ParseApiRequest(std::string_view body, bool chat,
                                           const ApiLimits& limits) {
  // Every access is type-checked; this only keeps a missed check from escaping as an exception.
  try {
    return Parse(body, chat, limits);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(StrCat("malformed request: ", e.what()));
  }
}

namespace {
absl::StatusOr<ApiRequest> Parse(std::string_view body, bool chat, const ApiLimits& limits) {
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        StrCat("request body nests arrays and objects deeper than ", kMaxJsonDepth, " levels"));
  }
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  // OpenAI's defaults: temperature 1, top_p 1, no top-k.
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 1.0f;
  r.sampling.top_k = 0;
  if (auto s = String(j, "model", r.model); !s.ok()) return s;
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end() || !it->is_array() || it->empty()) {
      return Bad("messages", "must be a non-empty array");
    }
    for (const json& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return Bad("messages", "entries need a string 'role'");
      }
      std::string role = m["role"];
      if (role == "developer") role = "system";  // OpenAI's newer name for system messages
      if (role != "system" && role != "user" && role != "assistant") {
        return Bad("messages",
                   StrCat("role '", role, "' is not system, developer, user or assistant"));
      }
      std::string content;
      const json& c = m.contains("content") ? m["content"] : json();
      if (c.is_null() && role == "assistant") {
        // OpenAI lets an assistant turn carry no content (one that called tools): empty here.
      } else if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {  // [{"type": "text", "text": ...}, ...], joined by newlines
        for (const json& part : c) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string() ||
              part["type"].get<std::string>() != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return Bad("messages", "content parts must be {\"type\": \"text\", \"text\": ...}");
          }
          if (&part != &c.front()) content += '\n';
          content += part["text"].get<std::string>();
        }
      } else {
        return Bad("messages", "content must be a string or an array of text parts");
      }
      r.messages.push_back({role, content});
    }
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return Bad("prompt", "is required");
    json p = *it;
    // A list holding one prompt is that prompt (LangChain sends one); several are refused.
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      if (p.size() != 1) return Bad("prompt", "holds several prompts: send one per request");
      p = p[0];
    }
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && !p.empty()) {  // token ids
      const uint64_t below =
          limits.vocab_size > 0 ? static_cast<uint64_t>(limits.vocab_size) : uint64_t{1} << 31;
      for (const json& t : p) {
        if (!t.is_number_integer() || (!t.is_number_unsigned() && t.get<int64_t>() < 0) ||
            t.get<uint64_t>() >= below) {
          return Bad("prompt", StrCat("token ids must be integers in [0, ", below, ")"));
        }
        r.prompt_ids.push_back(static_cast<int32_t>(t.get<uint64_t>()));
      }
    } else {
      return Bad("prompt", "must be a string or a non-empty array of token ids");
    }
  }
  if (auto s = Number(j, "n", 1, limits.max_choices, r.n); !s.ok()) return s;
  if (chat) {  // "logprobs": true, "top_logprobs": k
    if (auto s = Bool(j, "logprobs", r.logprobs); !s.ok()) return s;
    if (auto s = Number(j, "top_logprobs", 0, 20, r.top_logprobs); !s.ok()) return s;
    if (r.top_logprobs > 0 && !r.logprobs) return Bad("top_logprobs", "needs \"logprobs\": true");
  } else {  // "logprobs": k
    int32_t k = -1;
    if (auto s = Number(j, "logprobs", 0, 20, k); !s.ok()) return s;
    r.logprobs = k >= 0;
    r.top_logprobs = std::max(k, 0);
  }
  // Both are checked; max_completion_tokens, where given (not null), wins. Past the context
  // is refused later, in vLLM's words (the context less the prompt: http_server.cc).
  for (const char* f : {"max_tokens", "max_completion_tokens"}) {
    if (auto it = j.find(f); it == j.end() || it->is_null()) continue;
    int32_t v = 0;
    if (auto s = Number(j, f, 1, std::numeric_limits<int32_t>::max(), v); !s.ok()) return s;
    r.max_tokens = v;
  }
  if (auto s = Number(j, "temperature", 0.0, 2.0, r.sampling.temperature); !s.ok()) return s;
  // OpenAI's range is [0, 1]; 0 keeps only the most likely token, as the smallest nucleus does.
  if (auto s = Number(j, "top_p", 0.0, 1.0, r.sampling.top_p); !s.ok()) return s;
  r.sampling.top_p = std::max(r.sampling.top_p, std::numeric_limits<float>::min());
  if (auto s = Number(j, "top_k", -1, 1 << 20, r.sampling.top_k); !s.ok()) return s;
  if (auto s = Number(j, "repetition_penalty", 0.01, 100.0, r.sampling.repeat_penalty); !s.ok()) {
    return s;
  }
  r.sampling.seed = util::RandomSeed();  // no seed (or null): a fresh draw, as OpenAI's
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    // Any integer a double holds exactly; a negative one as its two's complement, as vLLM.
    int64_t seed = 0;
    if (auto s = Number(j, "seed", -9007199254740991.0, 9007199254740991.0, seed); !s.ok()) {
      return s;
    }
    r.sampling.seed = static_cast<uint64_t>(seed);
  }
  if (auto s = Bool(j, "stream", r.stream); !s.ok()) return s;
  if (auto s = Bool(j, "ignore_eos", r.ignore_eos); !s.ok()) return s;
  if (auto s = String(j, "session_id", r.session_id); !s.ok()) return s;
  if (r.n > 1 && !r.session_id.empty()) {
    return Bad("n", "must be 1 with a session_id (a session continues one conversation)");
  }
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "must be an object");
    if (!r.stream) return Bad("stream_options", "needs \"stream\": true");
    if (auto s = Bool(*it, "include_usage", r.include_usage); !s.ok()) return s;
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    const json list = it->is_string() ? json::array({*it}) : *it;
    if (!list.is_array() || list.size() > 4) {
      return Bad("stop", "must be a string or an array of at most 4 strings");
    }
    for (const auto& e : list) {
      if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>().size() > 256) {
        return Bad("stop", "each stop sequence must be a string of 1 to 256 bytes");
      }
      r.stop.push_back(e.get<std::string>());
    }
  }
  // OpenAI fields this server does not implement: refused rather than silently ignored (at
  // their defaults they change nothing and are accepted).
  for (const char* f : {"frequency_penalty", "presence_penalty"}) {
    if (auto it = j.find(f); it != j.end() && !it->is_null() && !(it->is_number() && *it == 0)) {
      return Bad(f, "is not supported (use repetition_penalty)");
    }
  }
  // The same for vLLM's extensions that change the output (guided decoding, min_p, ...).
  for (const char* f : {"tools",
                        "tool_choice",
                        "functions",
                        "function_call",
                        "logit_bias",
                        "response_format",
                        "suffix",
                        "best_of",
                        "echo",
                        "prediction",
                        "reasoning_effort",
                        "min_p",
                        "min_tokens",
                        "stop_token_ids",
                        "include_stop_str_in_output",
                        "continue_final_message",
                        "chat_template_kwargs",
                        "prompt_logprobs",
                        "guided_json",
                        "guided_regex",
                        "guided_choice",
                        "guided_grammar",
                        "structured_outputs"}) {
    auto it = j.find(f);
    if (it == j.end() || it->is_null()) continue;
    const std::string_view name(f);
    const bool harmless =
        (it->is_boolean() && !it->get<bool>()) ||  // "echo": false
        (it->is_number() && *it == 0 && (name == "min_p" || name == "min_tokens")) ||
        (it->is_array() && it->empty()) ||   // "tools": []
        (it->is_object() && it->empty()) ||  // "logit_bias": {}
        (name == "best_of" && *it == 1) || (name == "tool_choice" && *it == "none") ||
        (name == "response_format" && it->is_object() && it->value("type", json()) == "text");
    if (!harmless) return Bad(f, "is not supported by this server");
  }
  // vLLM's switches that are on by default: accepted on.
  for (const char* f : {"skip_special_tokens", "add_generation_prompt"}) {
    if (auto it = j.find(f); it != j.end() && !it->is_null() && *it != true) {
      return Bad(f, "is not supported by this server");
    }
  }
  if (r.sampling.top_k < 0) r.sampling.top_k = 0;
  return r;
}
}  // namespace

std::string CompletionJson(const ApiRequest& req, const std::string& id, int64_t created,
                           const std::vector<ApiChoice>& choices, const ApiUsage& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ApiChoice& c = choices[i];
    json choice = {{"index", i},
                   {"finish_reason", c.finish_reason},
                   {"logprobs", c.logprobs ? LogprobsJson(req, *c.logprobs) : json()}};
    if (req.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  json out = {{"id", id},
              {"object", req.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", std::move(list)},
              {"usage", Usage(usage)}};
  // An extension: the time to first token as the engine measured it (submit to first sample),
  // so clients can tell the API's own overhead.
  if (usage.engine_ttft_ms >= 0) out["kvmesh"] = {{"engine_ttft_ms", usage.engine_ttft_ms}};
  return Dump(out);
}

std::string StreamChunk(const ApiRequest& req, const std::string& id, int64_t created,
                        const std::string& delta, const std::string& finish_reason, bool first,
                        const std::vector<ApiLogprob>* logprobs, size_t text_offset, int index) {
  json choice = {{"index", index},
                 {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)},
                 {"logprobs", logprobs ? LogprobsJson(req, *logprobs, text_offset) : json()}};
  if (req.chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || finish_reason.empty()) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  json chunk = {{"id", id},
                {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", req.model},
                {"choices", json::array({choice})}};
  // With include_usage, every chunk but the last (StreamUsageChunk) carries a null usage.
  if (req.include_usage) chunk["usage"] = nullptr;
  return "data: " + Dump(chunk) + "\n\n";
}

std::string StreamUsageChunk(const ApiRequest& req, const std::string& id, int64_t created,
                             const ApiUsage& usage) {
  json chunk = {{"id", id},
                {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", req.model},
                {"choices", json::array()},
                {"usage", Usage(usage)}};
  if (usage.engine_ttft_ms >= 0) chunk["kvmesh"] = {{"engine_ttft_ms", usage.engine_ttft_ms}};
  return "data: " + Dump(chunk) + "\n\n";
}

std::string ModelsJson(std::string_view name, int64_t max_model_len, bool list) {
  const json model = {{"id", std::string(name)},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "kvmesh"},
                      {"max_model_len", max_model_len}};
  return Dump(list ? json{{"object", "list"}, {"data", json::array({model})}} : model);
}

std::string ErrorJson(int http_status, std::string_view message, std::string_view param) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status >= 500 ? "server_error"
                                          : "invalid_request_error";
  return Dump({{"error",
                {{"message", std::string(message)},
                 {"type", type},
                 {"param", param.empty() ? json() : json(std::string(param))},
                 {"code", http_status}}}});
}

}  // namespace kvmesh::server
