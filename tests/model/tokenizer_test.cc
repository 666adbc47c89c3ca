#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "tests/util/gguf_builder.h"
#include "tests/util/test_paths.h"

namespace kvmesh::model {
namespace {

class RealTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    KVMESH_REQUIRE_MODEL(path);
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    gguf_ = std::move(*f);
    auto t = Tokenizer::FromGguf(*gguf_);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
  }
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tok_;
};

// tokenizer_cases.json: >= 300 strings with llama.cpp's ids (make_tokenizer_fixture.py).
TEST_F(RealTokenizer, MatchesLlamaCppOnFixture) {
  const auto j =
      nlohmann::json::parse(testing::ReadFile(testing::FixturePath("tokenizer_cases.json")));
  const auto& cases = j.at("cases");
  ASSERT_GE(cases.size(), 300u);
  int checked = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto want_special = c.at("ids_special").get<std::vector<TokenId>>();
    const auto want_plain = c.at("ids_plain").get<std::vector<TokenId>>();
    EXPECT_EQ(tok_->Encode(text, /*parse_special=*/true), want_special) << "text: " << text;
    EXPECT_EQ(tok_->Encode(text, /*parse_special=*/false), want_plain) << "text: " << text;
    // Detokenisation round-trips: with control tokens spelled out, and (plain parse) exactly.
    EXPECT_EQ(tok_->Decode(want_special, /*special=*/true), text);
    EXPECT_EQ(tok_->Decode(want_plain), text);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

TEST_F(RealTokenizer, SpecialTokensAndEndOfGeneration) {
  EXPECT_EQ(tok_->Find("<|im_start|>"), 1);
  EXPECT_EQ(tok_->Find("<|im_end|>"), 2);
  EXPECT_EQ(tok_->type(1), TokenType::kControl);
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->IsEndOfGeneration(1));
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->Decode({1, 2}), "");  // control tokens are hidden unless asked for
  EXPECT_EQ(tok_->Decode({1, 2}, true), "<|im_start|><|im_end|>");
  EXPECT_EQ(tok_->Decode({-5, 1 << 30}), "");
}

TEST_F(RealTokenizer, RoundTripsInvalidUtf8Sequences) {
  // Truncated and stray UTF-8 bytes still round-trip byte for byte.
  const std::string bytes = "ok \xe2\x82 mid \x80\xbf end \xf0\x9f";
  EXPECT_EQ(tok_->Decode(tok_->Encode(bytes, false)), bytes);
  // Bytes that never occur in UTF-8 (0xF5..0xFF) have no token in SmolLM2's vocabulary; they
  // are dropped (as by llama.cpp) rather than mapped to some other token.
  EXPECT_EQ(tok_->Decode(tok_->Encode("a\xff"
                                      "b",
                                      false)),
            "ab");
}

TEST_F(RealTokenizer, ChatTemplateInsertsDefaultSystemMessage) {
  auto ct = ChatTemplate::FromGguf(*gguf_);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(ct->Render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ct->Render({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

// The default system message is the literal text of the template's system turn, not Jinja
// that builds it from the messages (whose fragment was once sent as a system turn), and is
// found also where the template writes the newline as the two characters \n.
TEST(ChatTemplate, DefaultSystemIsLiteralTextOnly) {
  auto default_of = [](const std::string& tmpl) -> std::string {
    testing::GgufBuilder b;
    b.Str("tokenizer.chat_template", tmpl);
    const std::string bytes = b.Build();
    auto f = GgufFile::FromBytes({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    if (!f.ok()) return "not a GGUF file";
    auto t = ChatTemplate::FromGguf(**f);
    return t.ok() ? t->default_system() : std::string(t.status().message());
  };
  EXPECT_EQ(default_of("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe kind."
                       "<|im_end|>\n' }}{% endif %}"),
            "Be kind.");
  EXPECT_EQ(default_of("{% if messages[0]['role']=='system' %}{{ '<|im_start|>system\n' + "
                       "messages[0]['content'] + '<|im_end|>\n' }}{% endif %}"),
            "");
  EXPECT_EQ(default_of("{{ \"<|im_start|>system\n\" + messages[0].content + \"<|im_end|>\" }}"),
            "");
  EXPECT_EQ(default_of("{{ '<|im_start|>system\\nYou\\'re Qwen.\\tBe brief.<|im_end|>\\n' }}"),
            "You're Qwen.\tBe brief.");
  EXPECT_EQ(default_of("{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                       "'<|im_end|>' }}"),
            "");
  // Built from the messages first (Qwen2.5's tools branch), the literal default in an else.
  EXPECT_EQ(default_of("{% if tools %}{{ '<|im_start|>system\n' }}{% if messages[0]['role'] == "
                       "'system' %}{{ messages[0]['content'] }}{% endif %}{{ '<|im_end|>\n' }}"
                       "{% else %}{{ '<|im_start|>system\nYou are Qwen.<|im_end|>\n' }}"
                       "{% endif %}"),
            "You are Qwen.");
  EXPECT_EQ(default_of("{{ '<|im_start|>system\n' ~ messages[0].content ~ '<|im_end|>' }}"), "");
}

// What Tokenizer::FromGguf makes of the file b builds (a failure of the test if that is not
// a GGUF file).
absl::Status TokenizerStatus(const testing::GgufBuilder& b) {
  const std::string bytes = b.Build();
  auto f = GgufFile::FromBytes({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  if (!f.ok()) {
    ADD_FAILURE() << "not a GGUF file: " << f.status();
    return f.status();
  }
  return Tokenizer::FromGguf(**f).status();
}

TEST(Tokenizer, RejectsUnsupportedTokenizerModels) {
  testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", "llama").StrArray("tokenizer.ggml.tokens", {"a"});
  const absl::Status t = TokenizerStatus(b);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.message()).find("tokenizer.ggml.model 'llama'"), std::string::npos);
}

// A pre-tokenizer name of another type is an error, not the default (which splits digits
// differently and so changes token ids without a word).
TEST(Tokenizer, RejectsAPreTokenizerNameOfAnotherType) {
  testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2")
      .U32("tokenizer.ggml.pre", 7)
      .StrArray("tokenizer.ggml.tokens", {"a"});
  const absl::Status t = TokenizerStatus(b);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.message()).find("tokenizer.ggml.pre"), std::string::npos) << t;
}

TEST(Tokenizer, RejectsOutOfRangeSpecialIds) {
  testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", {"a", "b"})
      .StrArray("tokenizer.ggml.merges", {"a b"})
      .U32("tokenizer.ggml.eos_token_id", 9);
  const absl::Status t = TokenizerStatus(b);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.message()).find("eos_token_id"), std::string::npos);
}

// A vocabulary past 2M entries is refused before its tables are built (a 17 MB file of empty
// tokens would otherwise take ~300 MB; at the old 16M bound, gigabytes).
TEST(Tokenizer, RejectsAnOversizedVocabulary) {
  testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", std::vector<std::string>((size_t{1} << 21) + 1))
      .StrArray("tokenizer.ggml.merges", {"a b"});
  const absl::Status t = TokenizerStatus(b);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(t.message()).find("vocabulary size 2097153 is out of range"),
            std::string::npos)
      << t;
}

// A missing required key is a malformed file (InvalidArgument), not a missing one (NotFound).
TEST(Tokenizer, AMissingRequiredKeyIsInvalidArgument) {
  testing::GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2").StrArray("tokenizer.ggml.tokens", {"a"});
  const absl::Status t = TokenizerStatus(b);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument) << t;
  EXPECT_NE(std::string(t.message()).find("tokenizer.ggml.merges"), std::string::npos);
}

}  // namespace
}  // namespace kvmesh::model
