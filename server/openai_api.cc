#include "server/openai_api.h"

#include <nlohmann/json.hpp>

#include "util/random_seed.h"
#include "util/str_cat.h"

namespace kvmesh::server {

using nlohmann::json;

namespace {

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(StrCat("'", field, "' ", why));
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

// OpenAI's logprobs object: {"content": [...]} for chat, parallel arrays for completions.
json LogprobsJson(const ApiRequest& req, const std::vector<ApiLogprob>& lps) {
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
  size_t offset = 0;
  for (const ApiLogprob& lp : lps) {
    tokens.push_back(lp.token);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (size_t i = 0; i < lp.top.size() && i < static_cast<size_t>(req.top_logprobs); ++i) {
      top[lp.top[i].first] = lp.top[i].second;
    }
    tops.push_back(top);
    offsets.push_back(offset);
    offset += lp.token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace

namespace {
absl::StatusOr<ApiRequest> Parse(std::string_view body, bool chat, const ApiLimits& limits);
}  // namespace

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
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  r.max_tokens = limits.default_max_tokens;
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
      const std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant") {
        return Bad("messages", StrCat("role '", role, "' is not system, user or assistant"));
      }
      std::string content;
      const json& c = m.contains("content") ? m["content"] : json();
      if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {  // [{"type": "text", "text": ...}, ...]
        for (const json& part : c) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string() ||
              part["type"].get<std::string>() != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return Bad("messages", "content parts must be {\"type\": \"text\", \"text\": ...}");
          }
          content += part["text"].get<std::string>();
        }
      } else {
        return Bad("messages", "content must be a string or an array of text parts");
      }
      r.messages.push_back({role, content});
    }
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || !it->is_string()) return Bad("prompt", "must be a string");
    r.prompt = it->get<std::string>();
  }
  int32_t n = 1;
  if (auto s = Number(j, "n", 1, 1, n); !s.ok()) {
    return Bad("n", "must be 1 (one choice per request)");
  }
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
  // Both are checked; a chat's max_completion_tokens, where given (not null), wins.
  const double max_context = static_cast<double>(limits.max_context);
  if (auto s = Number(j, "max_tokens", 0, max_context, r.max_tokens); !s.ok()) return s;
  if (chat) {
    if (auto s = Number(j, "max_completion_tokens", 0, max_context, r.max_tokens); !s.ok()) {
      return s;
    }
  }
  if (auto s = Number(j, "temperature", 0.0, 2.0, r.sampling.temperature); !s.ok()) return s;
  if (auto s = Number(j, "top_p", 1e-6, 1.0, r.sampling.top_p); !s.ok()) return s;
  if (auto s = Number(j, "top_k", -1, 1 << 20, r.sampling.top_k); !s.ok()) return s;
  if (auto s = Number(j, "repetition_penalty", 0.01, 100.0, r.sampling.repeat_penalty); !s.ok()) {
    return s;
  }
  r.sampling.seed = util::RandomSeed();  // no seed (or null): a fresh draw, as OpenAI's
  if (auto s = Number(j, "seed", 0, 9007199254740991.0, r.sampling.seed); !s.ok()) return s;
  if (auto s = Bool(j, "stream", r.stream); !s.ok()) return s;
  if (auto s = Bool(j, "ignore_eos", r.ignore_eos); !s.ok()) return s;
  if (auto s = String(j, "session_id", r.session_id); !s.ok()) return s;
  if (auto it = j.find("stream_options"); it != j.end() && it->is_object()) {
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
  for (const char* f : {"tools", "tool_choice", "functions", "function_call", "logit_bias",
                        "response_format", "suffix", "best_of", "echo"}) {
    auto it = j.find(f);
    if (it == j.end() || it->is_null()) continue;
    const std::string_view name(f);
    const bool harmless =
        (it->is_boolean() && !it->get<bool>()) ||  // "echo": false
        (it->is_array() && it->empty()) ||         // "tools": []
        (it->is_object() && it->empty()) ||        // "logit_bias": {}
        (name == "best_of" && *it == 1) || (name == "tool_choice" && *it == "none") ||
        (name == "response_format" && it->is_object() && it->value("type", json()) == "text");
    if (!harmless) return Bad(f, "is not supported by this server");
  }
  if (r.sampling.top_k < 0) r.sampling.top_k = 0;
  return r;
}
}  // namespace

std::string CompletionJson(const ApiRequest& req, const std::string& id, int64_t created,
                           const std::string& text, const std::string& finish_reason,
                           const ApiUsage& usage, const std::vector<ApiLogprob>* logprobs) {
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason},
                 {"logprobs", logprobs ? LogprobsJson(req, *logprobs) : json()}};
  if (req.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json out = {{"id", id},
              {"object", req.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", json::array({choice})},
              {"usage", Usage(usage)}};
  // An extension: the time to first token as the engine measured it (submit to first sample),
  // so clients can tell the API's own overhead.
  if (usage.engine_ttft_ms >= 0) out["kvmesh"] = {{"engine_ttft_ms", usage.engine_ttft_ms}};
  return Dump(out);
}

std::string StreamChunk(const ApiRequest& req, const std::string& id, int64_t created,
                        const std::string& delta, const std::string& finish_reason, bool first,
                        const std::vector<ApiLogprob>* logprobs) {
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)},
                 {"logprobs", logprobs ? LogprobsJson(req, *logprobs) : json()}};
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

std::string ErrorJson(int http_status, std::string_view message) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 404 ? "not_found_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status >= 500 ? "server_error"
                                          : "invalid_request_error";
  return Dump(
      {{"error", {{"message", std::string(message)}, {"type", type}, {"code", http_status}}}});
}

}  // namespace kvmesh::server
