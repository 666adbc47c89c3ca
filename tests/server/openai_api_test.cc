#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/max_tokens.h"
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
  EXPECT_EQ(r->messages[1].content, "hi \nthere");  // text parts joined by newlines, as vLLM
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.seed, 3u);
  EXPECT_TRUE(r->stream && r->include_usage && r->ignore_eos);
  EXPECT_EQ(r->session_id, "abc");
  auto d = ParseApiRequest(R"({"prompt": "x"})", false, {});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->max_tokens.has_value());   // not given: what the context leaves
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
  // A prompt as one string in a list (LangChain), or as token ids below the vocabulary.
  auto one = ParseApiRequest(R"({"prompt": ["x y"], "max_completion_tokens": 5})", false, {});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->prompt, "x y");
  EXPECT_EQ(one->max_tokens, 5);
  auto ids = ParseApiRequest(R"({"prompt": [1, 2, 99]})", false, {.vocab_size = 100});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 99}));
  EXPECT_TRUE(ids->prompt.empty());
  auto nested = ParseApiRequest(R"({"prompt": [[7, 8]]})", false, {.vocab_size = 100});
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->prompt_ids, (std::vector<int32_t>{7, 8}));
  // Any integer seed; a negative one as its two's complement.
  auto neg = ParseApiRequest(R"({"prompt": "x", "seed": -1})", false, {});
  ASSERT_TRUE(neg.ok()) << neg.status();
  EXPECT_EQ(neg->sampling.seed, ~uint64_t{0});
  // vLLM's extensions at their defaults change nothing and are accepted.
  auto v = ParseApiRequest(R"({"prompt": "x", "min_p": 0, "skip_special_tokens": true,
                               "add_generation_prompt": true, "stop_token_ids": [],
                               "include_stop_str_in_output": false})",
                           false, {});
  EXPECT_TRUE(v.ok()) << v.status();
}

// What OpenAI accepts and kvmesh once refused with a 400: the "developer" role (its newer name
// for system), an assistant turn with null content (one that called tools), top_p 0, and a
// max_tokens past the context (refused later, in vLLM's words, by the context check).
TEST(OpenAiApi, AcceptsWhatOpenAiAccepts) {
  auto r = ParseApiRequest(
      R"({"messages": [{"role": "developer", "content": "be brief"},
          {"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
          {"role": "user", "content": "again"}], "top_p": 0, "max_tokens": 100000})",
      true, {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[2].role, "assistant");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_GT(r->sampling.top_p, 0.0f);  // the smallest nucleus: the most likely token alone
  EXPECT_LT(r->sampling.top_p, 1e-30f);
  EXPECT_TRUE(r->sampling.Validate().ok());
  EXPECT_EQ(r->max_tokens, 100000);
  // Only an assistant turn may be empty.
  auto u = ParseApiRequest(R"({"messages": [{"role": "user", "content": null}]})", true, {});
  ASSERT_FALSE(u.ok());
  EXPECT_NE(std::string(u.status().message()).find("content must be"), std::string::npos);
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
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 17})", "'n'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "'n'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 1.5})", "integer"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "session_id": "s"})",
       "session_id"},
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
      {R"({"messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "object"}})",
       "'guided_json' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [2]})",
       "'stop_token_ids' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "min_p": 0.1})",
       "'min_p' is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "skip_special_tokens": false})",
       "'skip_special_tokens' is not supported"},
      // At least one token; stream_options only with a stream.
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "'max_tokens'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {}})",
       "'stream_options' needs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": 1})",
       "'stream_options' must be an object"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = ParseApiRequest(body, true, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << body << " -> " << r.status().message();
    // The field named in the message is the error object's "param".
    const std::string param = ParamOf(r.status());
    if (!param.empty()) {
      EXPECT_EQ(r.status().message().rfind("'" + param + "'", 0), 0u) << r.status().message();
    }
  }
  EXPECT_EQ(ParamOf(ParseApiRequest(R"({"messages": "hi"})", true, {}).status()), "messages");
  // Prompts: one per request; token ids within the vocabulary.
  for (const char* body : {R"({"prompt": ["a", "b"]})", R"({"prompt": []})", R"({"prompt": 1})",
                           R"({"prompt": [1, -2]})", R"({"prompt": [1, 100]})",
                           R"({"prompt": [1, "a"]})", R"({"prompt": [[1], [2]]})", R"({})"}) {
    auto p = ParseApiRequest(body, false, {.vocab_size = 100});
    ASSERT_FALSE(p.ok()) << body;
    EXPECT_EQ(ParamOf(p.status()), "prompt") << body;
  }
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

// A body of deeply nested arrays (~1 MB, under the body limit) in each field that takes an array
// or an object: refused with 400. The JSON library parses and frees them without recursion, but
// copies them recursively, and the parser copied the prompt, the stop list and a message's
// content: a stack overflow that took the whole server down.
TEST(OpenAiApi, RefusesBodiesNestedTooDeep) {
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  for (const auto& [chat, body] : std::vector<std::pair<bool, std::string>>{
           {false, R"({"prompt": )" + deep + "}"},
           {false, R"({"prompt": "x", "stop": )" + deep + "}"},
           {true, R"({"messages": [{"role": "user", "content": )" + deep + "}]}"},
           {false, R"({"prompt": "x", "extra": {"a": )" + deep + "}}"},
       }) {
    auto r = ParseApiRequest(body, chat, {});
    ASSERT_FALSE(r.ok()) << body.substr(0, 40);
    EXPECT_EQ(r.status().message(), "request body nests arrays and objects deeper than 64 levels");
  }
  // 64 levels are accepted (here as a field the parser ignores); brackets inside strings, and
  // escaped quotes before them, are text, not nesting.
  const std::string ok64 = std::string(63, '[') + std::string(63, ']');
  EXPECT_TRUE(ParseApiRequest(R"({"prompt": "x", "extra": )" + ok64 + "}", false, {}).ok());
  EXPECT_FALSE(ParseApiRequest(R"({"prompt": "x", "extra": [)" + ok64 + "]}", false, {}).ok());
  auto text = ParseApiRequest(R"({"prompt": "\"\\)" + std::string(1000, '[') + "\"}", false, {});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->prompt.size(), 1002u);
}

TEST(OpenAiApi, ResponsesAndChunksHaveTheOpenAiShape) {
  ApiRequest chat;
  chat.chat = true;
  chat.model = "m";
  const json c = json::parse(CompletionJson(chat, "id1", 5, {{"Paris.", "stop"}}, {10, 3, 8}));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(c["choices"].size(), 1u);
  EXPECT_EQ(c["usage"]["total_tokens"], 13);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  const std::string chunk = StreamChunk(chat, "id1", 5, "Par", "", true);
  ASSERT_EQ(chunk.rfind("data: ", 0), 0u);
  ASSERT_EQ(chunk.substr(chunk.size() - 2), "\n\n");
  const json k = json::parse(chunk.substr(6));
  EXPECT_EQ(k["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  // n choices: each with its index; a choice's chunks carry it.
  ApiRequest two = chat;
  two.n = 2;
  const json m =
      json::parse(CompletionJson(two, "id4", 5, {{"Paris.", "stop"}, {"Lyon", "length"}}, {}));
  ASSERT_EQ(m["choices"].size(), 2u);
  EXPECT_EQ(m["choices"][1]["index"], 1);
  EXPECT_EQ(m["choices"][1]["message"]["content"], "Lyon");
  EXPECT_EQ(m["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(m["choices"][0]["index"], 0);
  const json k1 = json::parse(StreamChunk(two, "id4", 5, "Ly", "", true, nullptr, 0, 1).substr(6));
  EXPECT_EQ(k1["choices"][0]["index"], 1);
  EXPECT_EQ(k1["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(k1.contains("usage"));
  // With include_usage, the chunks before the usage chunk carry "usage": null (OpenAI's spec).
  two.include_usage = true;
  const json k2 = json::parse(StreamChunk(two, "id4", 5, "on", "", false, nullptr, 0, 1).substr(6));
  ASSERT_TRUE(k2.contains("usage"));
  EXPECT_TRUE(k2["usage"].is_null());
  auto n3 = ParseApiRequest(R"({"prompt": "a", "n": 3, "seed": 7})", false, {});
  ASSERT_TRUE(n3.ok()) << n3.status();
  EXPECT_EQ(n3->n, 3);
  EXPECT_EQ(ParseApiRequest(R"({"prompt": "a"})", false, {})->n, 1);
  const json e = json::parse(ErrorJson(429, "queue full"));
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(e["error"].contains("param") && e["error"]["param"].is_null());
  EXPECT_EQ(json::parse(ErrorJson(400, "bad", "messages"))["error"]["param"], "messages");
  // A streamed completion's text_offset counts on from the characters streamed before.
  ApiRequest cmpl;
  cmpl.logprobs = true;
  const std::vector<ApiLogprob> lps = {{"\xC3\xA9t", -0.5f, {}}, {"é", -1.0f, {}}};
  const json s = json::parse(StreamChunk(cmpl, "id2", 5, "x", "", false, &lps, 7).substr(6));
  EXPECT_EQ(s["choices"][0]["logprobs"]["text_offset"], json::array({7, 9}));
  EXPECT_EQ(TextOffsetOf("\xC3\xA9t"), 2u);
  // A control token mid-answer (ignore_eos) shows its name but adds nothing to the text, so the
  // tokens after it keep their offsets.
  const std::vector<ApiLogprob> ctl = {
      {"a", -0.1f, {}, std::nullopt}, {"<|im_end|>", -0.2f, {}, ""}, {"b", -0.3f, {}, "b"}};
  const json o = json::parse(StreamChunk(cmpl, "id3", 5, "ab", "", false, &ctl, 0).substr(6));
  EXPECT_EQ(o["choices"][0]["logprobs"]["text_offset"], json::array({0, 1, 1}));
  EXPECT_EQ(o["choices"][0]["logprobs"]["tokens"][1], "<|im_end|>");
  // Tokens that are not whole UTF-8 (bytes of one emoji) are named by their bytes, so the
  // alternatives keep one key each (as U+FFFD they shared one, and JSON parsers kept the last).
  ApiRequest top2 = cmpl;
  top2.top_logprobs = 2;
  const std::vector<ApiLogprob> split = {
      {"\xF0\x9F", -0.1f, {{"\xF0\x9F", -0.1f}, {"\xE2\x9C", -2.5f}}}};
  const json b = json::parse(StreamChunk(top2, "id4", 5, "", "", false, &split, 0).substr(6));
  EXPECT_EQ(b["choices"][0]["logprobs"]["tokens"][0], "bytes:\\xf0\\x9f");
  EXPECT_EQ(b["choices"][0]["logprobs"]["top_logprobs"][0],
            json({{"bytes:\\xf0\\x9f", -0.1f}, {"bytes:\\xe2\\x9c", -2.5f}}));
  // The models list and a model object; a name that needs escaping stays valid JSON.
  const json list = json::parse(ModelsJson("a\"b", 8192, true));
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "a\"b");
  EXPECT_EQ(json::parse(ModelsJson("m", 4096, false))["max_model_len"], 4096);
}

// The context error both servers send, in vLLM's two wordings.
TEST(OpenAiApi, ContextErrorInVllmsWords) {
  EXPECT_EQ(ContextError(8192, 9000, 16, "messages"),
            "This model's maximum context length is 8192 tokens. However, your request has 9000 "
            "input tokens. Please reduce the length of the input messages.");
  EXPECT_EQ(ContextError(8192, 100, 8100, "prompt"),
            "This model's maximum context length is 8192 tokens. However, you requested 8200 "
            "tokens (100 in the prompt, 8100 in the completion). Please reduce the length of the "
            "prompt or completion.");
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
  // Numbers as their shortest round-trip text: le="0.005", not "0.0050000000000000001".
  EXPECT_NE(t.find("kvmesh:kv_cache_usage_perc{model_name=\"m\"} 0.4\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE kvmesh:kv_cache_num_blocks gauge\n"
                   "kvmesh:kv_cache_num_blocks{model_name=\"m\"} 10\n"),
            std::string::npos);
  EXPECT_EQ(t.find("_total gauge"), std::string::npos);  // _total is for counters
  EXPECT_NE(t.find("kvmesh:request_failed_total{model_name=\"m\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("kvmesh:prefix_cache_hits_total{model_name=\"m\"} 99"), std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1\n"),
            std::string::npos);
  // TTFT's buckets reach past a minute (a long prompt on a CPU); a label value is escaped.
  EXPECT_NE(t.find("le=\"7680\"} 2\n"), std::string::npos);
  EXPECT_NE(PrometheusText(s, "a\"b\\c\nd").find("model_name=\"a\\\"b\\\\c\\nd\""),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:time_to_first_token_seconds_count{model_name=\"m\"} 2"),
            std::string::npos);
  for (const char* h : {"request_queue_time_seconds", "request_prefill_time_seconds",
                        "request_decode_time_seconds"}) {
    EXPECT_NE(t.find(std::string("# TYPE kvmesh:") + h + " histogram\n"), std::string::npos) << h;
    EXPECT_NE(t.find(std::string("kvmesh:") + h + "_count{model_name=\"m\"} 0\n"),
              std::string::npos)
        << h;
  }
  // One replica: no per-replica series.
  EXPECT_EQ(t.find("kvmesh:replica_"), std::string::npos);
  s.replicas.resize(1);
  EXPECT_EQ(PrometheusText(s, "m").find("kvmesh:replica_"), std::string::npos);
}

TEST(Metrics, DataParallelReplicasGetASeriesEach) {
  EngineSnapshot s;
  s.replicas.resize(2);
  s.replicas[0].submitted = 3;
  s.replicas[1].submitted = 1;
  s.replicas[1].running = 1;
  s.replicas[1].blocks_total = 8;
  s.replicas[1].blocks_used = 2;
  s.replicas[0].prefix_hit_tokens = 672;
  const std::string t = PrometheusText(s, "m");
  EXPECT_NE(t.find("# TYPE kvmesh:replica_requests_total counter\n"
                   "kvmesh:replica_requests_total{model_name=\"m\",replica=\"0\"} 3\n"
                   "kvmesh:replica_requests_total{model_name=\"m\",replica=\"1\"} 1\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("kvmesh:replica_num_requests_running{model_name=\"m\",replica=\"1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:replica_num_requests_waiting{model_name=\"m\",replica=\"0\"} 0\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:replica_prefix_cache_hits_total{model_name=\"m\",replica=\"0\"} 672\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvmesh:replica_kv_cache_usage_perc{model_name=\"m\",replica=\"1\"} 0.25\n"),
            std::string::npos);
}

TEST(Metrics, HttpResponsesGetASeriesPerStatusCode) {
  const EngineSnapshot s;
  // No responses yet (or not the HTTP server's scrape): no family.
  EXPECT_EQ(PrometheusText(s, "m").find("# TYPE kvmesh:http_responses_total"), std::string::npos);
  const std::string t = PrometheusText(s, "m", {{200, 12}, {400, 7}, {429, 1}});
  EXPECT_NE(t.find("# TYPE kvmesh:http_responses_total counter\n"
                   "kvmesh:http_responses_total{model_name=\"m\",code=\"200\"} 12\n"
                   "kvmesh:http_responses_total{model_name=\"m\",code=\"400\"} 7\n"
                   "kvmesh:http_responses_total{model_name=\"m\",code=\"429\"} 1\n"),
            std::string::npos)
      << t;
}

}  // namespace
}  // namespace kvmesh::server
