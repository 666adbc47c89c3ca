#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/metrics_text.h"

namespace kvmesh::server {
namespace {

using nlohmann::json;

TEST(OpenAiApi, ParsesChatWithDefaultsAndExtensions) {
  auto r = ParseApiRequest(
      R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
          "max_tokens": 7, "temperature": 0, "seed": 3, "stream": true,
          "stream_options": {"include_usage": true}, "session_id": "abc", "ignore_eos": true})",
      true, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1].content, "hi there");
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.seed, 3u);
  EXPECT_TRUE(r->stream && r->include_usage && r->ignore_eos);
  EXPECT_EQ(r->session_id, "abc");
  auto d = ParseApiRequest(R"({"prompt": "x"})", false, {.default_max_tokens = 16});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->max_tokens, 16);
  EXPECT_EQ(d->sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(d->sampling.top_p, 1.0f);
  // No seed (or a null one): a fresh draw per request, as OpenAI's; a given seed is kept.
  auto e = ParseApiRequest(R"({"prompt": "x", "seed": null})", false, {});
  ASSERT_TRUE(e.ok());
  EXPECT_NE(d->sampling.seed, e->sampling.seed);
  auto c = ParseApiRequest(R"({"messages": [{"role": "user", "content": "x"}],
                               "max_tokens": 9, "max_completion_tokens": 4})",
                           true, {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tokens, 4) << "max_completion_tokens wins";
  // stop: a string or up to 4; the defaults of unimplemented fields are accepted.
  auto st = ParseApiRequest(R"({"prompt": "x", "stop": "\n\n", "frequency_penalty": 0,
                                "presence_penalty": null, "tools": [], "echo": false,
                                "response_format": {"type": "text"}, "best_of": 1})",
                            false, {});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->stop, std::vector<std::string>{"\n\n"});
  auto st2 = ParseApiRequest(R"({"prompt": "x", "stop": ["a", "bc"]})", false, {});
  ASSERT_TRUE(st2.ok());
  EXPECT_EQ(st2->stop, (std::vector<std::string>{"a", "bc"}));
}

TEST(OpenAiApi, RejectsMalformedBodiesNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "not valid JSON"},
      {"[1]", "JSON object"},
      {R"({"messages": "hi"})", "'messages'"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})", "role 'bot'"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "content"},
      {R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]})",
       "content parts"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 3})", "'n'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", "'max_tokens'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "integer"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})",
       "'temperature'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "needs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
       "'top_logprobs'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": 1})", "'stream'"},
      // A null max_completion_tokens does not hide a bad max_tokens.
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": null,
           "max_tokens": -5})",
       "'max_tokens'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3,
           "max_tokens": "lots"})",
       "'max_tokens'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1})",
       "'max_completion_tokens'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]})",
       "'stop'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "'stop'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": 3})", "'stop'"},
      // Not implemented: refused, not ignored.
      {R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5})",
       "'frequency_penalty' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "'tools' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       "'response_format' is not supported"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = ParseApiRequest(body, true, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << body << " -> " << r.status().message();
  }
  EXPECT_FALSE(ParseApiRequest(R"({"prompt": ["a"]})", false, {}).ok());
  EXPECT_NE(ParseApiRequest(R"({"prompt": "a", "logprobs": 21})", false, {})
                .status()
                .message()
                .find("'logprobs'"),
            std::string::npos);
  auto lp = ParseApiRequest(R"({"prompt": "a", "logprobs": 0})", false, {});
  ASSERT_TRUE(lp.ok());
  EXPECT_TRUE(lp->logprobs);  // the sampled token's logprob, no alternatives
  EXPECT_EQ(lp->top_logprobs, 0);
}

TEST(OpenAiApi, ResponsesAndChunksHaveTheOpenAiShape) {
  ApiRequest chat;
  chat.chat = true;
  chat.model = "m";
  const json c = json::parse(CompletionJson(chat, "id1", 5, "Paris.", "stop", {10, 3, 8}));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(c["usage"]["total_tokens"], 13);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  const std::string chunk = StreamChunk(chat, "id1", 5, "Par", "", true);
  ASSERT_EQ(chunk.rfind("data: ", 0), 0u);
  ASSERT_EQ(chunk.substr(chunk.size() - 2), "\n\n");
  const json k = json::parse(chunk.substr(6));
  EXPECT_EQ(k["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  const json e = json::parse(ErrorJson(429, "queue full"));
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
}

TEST(Metrics, PrometheusTextHasCountersGaugesAndCumulativeHistograms) {
  EngineSnapshot s;
  s.stats.running = 2;
  s.stats.blocks_total = 10;
  s.stats.blocks_used = 4;
  s.stats.prefix_hit_tokens = 99;
  s.ttft.Observe(0.003);
  s.ttft.Observe(0.5);
  const std::string t = PrometheusText(s, "m");
  EXPECT_NE(t.find("# TYPE kvmesh:num_requests_running "
                   "gauge\nkvmesh:num_requests_running{model_name=\"m\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:kv_cache_usage_perc{model_name=\"m\"} 0.40000000000000002"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:prefix_cache_hits_total{model_name=\"m\"} 99"), std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0."
                   "0050000000000000001\"} 1"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_count{model_name=\"m\"} 2"),
            std::string::npos);
}

}  // namespace
}  // namespace kvmesh::server
