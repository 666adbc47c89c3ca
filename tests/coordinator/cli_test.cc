// The kvmesh binary end to end: bad input gives one line on stderr and a non-zero exit; the
// real model answers through `run`, `tokenize` and `logits`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "kernels/packed.h"
#include "tests/util/gguf_builder.h"
#include "tests/util/test_paths.h"

namespace kvmesh {
namespace {

struct Result {
  int code;
  std::string out, err;
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Result Kvmesh(const std::vector<std::string>& args) {
  // Per process: ctest runs each test in its own process, two at a time, in the same TempDir.
  const std::string dir = ::testing::TempDir() + "/kvmesh_cli_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string cmd = KVMESH_BIN;
  for (const auto& a : args) cmd.append(" ").append(Quote(a));  // not " " + ...: GCC 12 -Wrestrict
  cmd += " >" + dir + "/cli.out 2>" + dir + "/cli.err";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, testing::ReadFile(dir + "/cli.out"),
          testing::ReadFile(dir + "/cli.err")};
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string dir = ::testing::TempDir() + "/kvmesh_cli_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return path;
}

void ExpectOneLineError(const std::vector<std::string>& args, const std::string& needle) {
  const Result r = Kvmesh(args);
  EXPECT_NE(r.code, 0) << "args: " << args[0];
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("kvmesh: error: ", 0), 0u) << "stderr: " << r.err;
}

TEST(Cli, InvalidFlagsAndCommands) {
  ExpectOneLineError({"frobnicate"}, "unknown command 'frobnicate'");
  // Help after any command, on stdout with status 0; as another flag's value it is that value.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"help"},
                                             {"--help"},
                                             {"-h"},
                                             {"run", "--help"},
                                             {"run", "--max-tokens", "3", "-h"},
                                             {"serve", "--help"},
                                             {"bench", "-h"},
                                             {"tokenize", "--help"},
                                             {"logits", "--help"},
                                             {"client", "--help"},
                                             {"client", "generate", "--help"},
                                             {"model", "--help"},
                                             {"model", "pull", "-h"}}) {
    const Result r = Kvmesh(args);
    EXPECT_EQ(r.code, 0) << args.back();
    EXPECT_EQ(r.out.rfind("usage: kvmesh <command>", 0), 0u) << args.back() << ": " << r.out;
    EXPECT_EQ(r.err, "") << args.back();
  }
  ExpectOneLineError({"run", "--model", "--help", "--prompt", "x"},
                     "cannot open model file '--help'");
  const Result bare = Kvmesh({});
  EXPECT_EQ(bare.code, 2);
  EXPECT_EQ(bare.out, "");
  EXPECT_EQ(bare.err.rfind("usage: kvmesh <command>", 0), 0u) << bare.err;
  // A missing or conflicting flag is named before the client connects (port 1: nothing there).
  ExpectOneLineError({"client", "generate", "--port", "1"},
                     "client generate: --prompt is required");
  ExpectOneLineError({"client", "chat", "--port", "1"}, "client chat: --message is required");
  ExpectOneLineError({"client", "tokenize", "--port", "1"}, "client tokenize: --text is required");
  ExpectOneLineError({"client", "generate", "--port", "1", "--prompt", "x", "--n", "17"},
                     "--n must be an integer in [1, 16], got '17'");
  ExpectOneLineError({"client", "health", "--port", "1", "--api-key", "k", "--api-key-file", "f"},
                     "client: give --api-key or --api-key-file, not both");
  ExpectOneLineError({"client", "health", "--port", "1", "--api-key", ""},
                     "client: --api-key is empty");
  ExpectOneLineError({"bench", "-m", "a.gguf", "--model", "b.gguf"},
                     "bench: give -m or --model, not both");
  ExpectOneLineError({"bench", "-m", "/nonexistent/m.gguf"},
                     "cannot open model file '/nonexistent/m.gguf'");
  ExpectOneLineError({"run"}, "give exactly one of --prompt, --session and --prompts");
  ExpectOneLineError({"run", "--prompt", "x", "--temperature", "-1"},
                     "--temperature must be a number in [0, 100]");
  ExpectOneLineError({"run", "--prompt", "x", "--max-tokens", "abc"},
                     "--max-tokens must be an integer");
  ExpectOneLineError({"run", "--prompt", "x", "--top-p", "2"}, "--top-p must be a number");
  ExpectOneLineError({"run", "--prompt", "x", "--threads", "-3"}, "--threads must be an integer");
  ExpectOneLineError({"run", "--prompt", "x", "--seed", "-1"},
                     "--seed must be a non-negative integer");
  ExpectOneLineError({"run", "--prompt", "x", "--bogus"}, "unknown flag --bogus");
  // Numbers as written: no blanks or hexadecimal (" -1" passed as an unsigned seed).
  ExpectOneLineError({"run", "--prompt", "x", "--seed", " -1"}, "--seed must be a non-negative");
  ExpectOneLineError({"run", "--prompt", "x", "--temperature", "0x10"}, "--temperature must be");
  ExpectOneLineError({"run", "--prompt", "x", "--max-tokens", " 5"}, "--max-tokens must be");
  // Prompt files: bounded, not directories.
  ExpectOneLineError({"run", "--session", "/dev/zero"}, "is larger than 64 MiB");
  ExpectOneLineError({"run", "--prompts", ::testing::TempDir()}, "is a directory");
  ExpectOneLineError({"serve", "--api-key-file", "/dev/zero"}, "longer than 4096 bytes");
  ExpectOneLineError({"serve", "--api-key-file", ::testing::TempDir()}, "is a directory");
  ExpectOneLineError({"serve", "--api-key-file", WriteTemp("nul.key", std::string("ab\0c\n", 5))},
                     "holds a NUL byte");
  ExpectOneLineError({"client", "health", "--api-key-file", "/dev/zero"}, "longer than 4096");
  ExpectOneLineError({"client", "bogus", "--port", "1"}, "client: unknown action 'bogus'");
  ExpectOneLineError({"client", "session", "--id", "", "--port", "1", "--turns", "/dev/null"},
                     "client session: --id and --turns FILE are required");
  // A session's turns are read as run --session reads them, before connecting.
  ExpectOneLineError({"client", "session", "--id", "x", "--port", "1", "--turns", "/dev/zero"},
                     "--turns file '/dev/zero' is larger than 64 MiB");
  ExpectOneLineError({"client", "session", "--id", "x", "--port", "1", "--turns",
                      WriteTemp("broken_turns.txt", "[\"a\",,]")},
                     "not a JSON array of strings");
  // Every request queues before it runs: an empty queue would refuse them all.
  ExpectOneLineError({"run", "--prompt", "x", "--max-waiting", "0"},
                     "--max-waiting must be an integer in [1, 1048576], got '0'");
  ExpectOneLineError({"run", "--prompt", "x", "--tp-collectives", "gloo"},
                     "--tp-collectives must be shm or mpi, not 'gloo'");
  ExpectOneLineError({"run", "--prompt", "x", "--activation-bits", "12"},
                     "--activation-bits must be 8 or 16, not 12");
  ExpectOneLineError({"run", "--prompt", "x", "--activation-bits", "4"}, "--activation-bits must");
  ExpectOneLineError({"run", "--prompt", "x", "--attention-bits", "24"},
                     "--attention-bits must be 16 or 32, not 24");
  ExpectOneLineError({"run", "--prompt", "x", "--attention-bits", "16", "--block-size", "8"},
                     "16-bit attention needs a block size that is a multiple of 16, not 8");
  ExpectOneLineError({"run", "--prompt"}, "flag --prompt needs a value");
  ExpectOneLineError({"run", "--chat=yes", "--prompt", "x"}, "flag --chat takes no value");
  ExpectOneLineError({"tokenize", "--model", "/x"}, "--text is required");
  ExpectOneLineError({"model", "push"}, "kvmesh model pull");
  ExpectOneLineError({"run", "--prompt", "x", "--session", "s.txt"},
                     "give exactly one of --prompt, --session and --prompts");
  ExpectOneLineError({"run", "--session", "/nonexistent/session.txt"},
                     "cannot open --session file '/nonexistent/session.txt'");
  ExpectOneLineError({"run", "--session", WriteTemp("bad.json", "[\"ok\", 3]")},
                     "every entry must be a string");
  ExpectOneLineError({"run", "--session", WriteTemp("broken.json", "[\"unterminated")},
                     "not a JSON array of strings");
  ExpectOneLineError({"run", "--session", WriteTemp("empty.txt", "\n  \n")}, "is empty");
  // Begun as an array of strings: JSON whatever the name, so a broken one is an error (not
  // each of its lines run as a turn).
  ExpectOneLineError({"run", "--session", WriteTemp("broken.txt", "[\"a\",\n\"b\",,]\n")},
                     "not a JSON array of strings");
  ExpectOneLineError({"run", "--prompts", "/nonexistent/p.txt"},
                     "cannot open --prompts file '/nonexistent/p.txt'");
  ExpectOneLineError({"run", "--prompts", WriteTemp("p.txt", "hi\n"), "--test-preempt", "2"},
                     "--test-preempt");
  // serve --config: the YAML file is checked before anything starts.
  ExpectOneLineError({"serve", "--config", "/nonexistent/c.yaml"},
                     "cannot open --config file '/nonexistent/c.yaml'");
  ExpectOneLineError({"serve", "--config", WriteTemp("c1.yaml", "max_num_seqs: 4\ncolour: blue\n")},
                     "unknown setting 'colour'");
  ExpectOneLineError({"serve", "--config", WriteTemp("c2.yaml", "max_num_seqs: many\n")},
                     "'max_num_seqs' must be an integer");
  ExpectOneLineError({"serve", "--config", WriteTemp("c3.yaml", "data_parallel_size: 2\n")},
                     "world size 1 does not match dp x pp x tp = 2 x 1 x 1");
  ExpectOneLineError({"serve", "--config", WriteTemp("c4.yaml", "port: [1, 2\n")}, "line ");
  // A value out of range is named by its key and file, not by the flag it stands for.
  const std::string c5 = WriteTemp("c5.yaml", "activation_bits: 12\n");
  ExpectOneLineError({"serve", "--config", c5},
                     "'activation_bits' in --config '" + c5 + "' must be 8 or 16, not 12");
  const std::string c9 = WriteTemp("c9.yaml", "max_model_len: -5\nport: 99999\n");
  ExpectOneLineError({"serve", "--config", c9},
                     "'port' in --config '" + c9 + "' must be an integer in [0, 65535]");
  // The command line's value is the flag's.
  ExpectOneLineError({"serve", "--config", c9, "--port", "0"},
                     "'max_model_len' in --config '" + c9 + "' must be an integer");
  ExpectOneLineError({"serve", "--config", c9, "--port", "0", "--ctx-size", "-1"},
                     "--ctx-size must be an integer");
  ExpectOneLineError({"serve", "--config", WriteTemp("c5.yaml", "enable_prefix_caching: maybe\n")},
                     "must be true or false");
  ExpectOneLineError({"serve", "--config", WriteTemp("c6.yaml", "repack_weights: 2\n")},
                     "'repack_weights' must be true or false");
  ExpectOneLineError(
      {"serve", "--config", WriteTemp("c8.yaml", "port: " + std::string(2000, '[') + "\n")},
      "nested too deeply");
  ExpectOneLineError({"serve", "--port", "70000"}, "--port");
  ExpectOneLineError({"serve", "--prefix-reuse", "--no-prefix-reuse"},
                     "give --prefix-reuse or --no-prefix-reuse, not both");
  // kvmesh bench takes llama-bench's one-dash flags and names them that way.
  ExpectOneLineError({"bench", "-p", "x"}, "-p must be a comma-separated list of integers");
  ExpectOneLineError({"bench", "-r", "0"}, "-r must be an integer in [1, 1000], got '0'");
  ExpectOneLineError({"bench", "-n"}, "flag -n needs a value");
  ExpectOneLineError({"bench", "--t", "0"}, "-t must be a comma-separated list");
  EXPECT_EQ(Kvmesh({"bench", "-r", "0"}).err.find("--r"), std::string::npos);
  ExpectOneLineError({"serve", "--config", ::testing::TempDir()}, "is a directory, not a file");
  // An empty key would turn authentication off.
  ExpectOneLineError({"serve", "--api-key", ""}, "--api-key is empty");
  // A key no HTTP client can send (a header holds no control character, and loses the blanks
  // at its ends) is refused, as it would refuse every request. (A missing model: were the key
  // taken, the command fails there instead of serving.)
  const std::string no_model = "/nonexistent/m.gguf";
  ExpectOneLineError({"serve", "--model", no_model, "--api-key", " "},
                     "--api-key: the key begins or ends with a blank");
  ExpectOneLineError({"serve", "--model", no_model, "--api-key", "abc\r"},
                     "--api-key: the key holds a control character");
  ExpectOneLineError(
      {"serve", "--model", no_model, "--api-key-file", WriteTemp("lead.key", " abc\n")},
      "--api-key-file: the key begins or ends with a blank");
  // YAML leaves a repeated key to the reader: refused, not a guess at which one wins (the last
  // port here is out of range, so taking it fails too).
  ExpectOneLineError({"serve", "--config", WriteTemp("c10.yaml", "port: 1\nport: 99999\n")},
                     "line 2: 'port' is set twice");
  ExpectOneLineError({"serve", "--config", WriteTemp("c6.yaml", "api_key: \"\"\n")},
                     "'api_key' in --config '");
  // A key on the command line replaces the file's, in either form (not "give one, not both").
  ExpectOneLineError(
      {"serve", "--config", WriteTemp("c7.yaml", "api_key_file: /nonexistent\n"), "--api-key", ""},
      "--api-key is empty");
}

TEST(Cli, BadModelFiles) {
  ExpectOneLineError({"run", "--model", "/nonexistent/m.gguf", "--prompt", "x"},
                     "cannot open model file '/nonexistent/m.gguf'");
  const std::string text = WriteTemp("text.gguf", "just some text, definitely not a model\n");
  ExpectOneLineError({"run", "--model", text, "--prompt", "x"}, "not a GGUF file");
  testing::GgufBuilder gpt2;
  gpt2.Str("general.architecture", "gpt2");
  ExpectOneLineError({"run", "--model", WriteTemp("gpt2.gguf", gpt2.Build()), "--prompt", "x"},
                     "unsupported architecture 'gpt2'");
  testing::GgufBuilder iq3;
  iq3.Str("general.architecture", "llama")
      .Tensor("token_embd.weight", {256, 1}, 18, std::string(98, '\0'));
  ExpectOneLineError({"run", "--model", WriteTemp("iq3.gguf", iq3.Build()), "--prompt", "x"},
                     "tensor 'token_embd.weight': unsupported tensor type IQ3_XXS");
  // A file's strings reach the message escaped and cut: one line, no terminal escapes.
  testing::GgufBuilder evil;
  evil.Str("general.architecture", "x\nkvmesh: forged line\x1b[2J" + std::string(5000, 'A'));
  ExpectOneLineError({"run", "--model", WriteTemp("evil.gguf", evil.Build()), "--prompt", "x"},
                     "unsupported architecture 'x\\x0akvmesh: forged line\\x1b[2JAAA");
  const Result long_name =
      Kvmesh({"run", "--model", WriteTemp("evil.gguf", evil.Build()), "--prompt", "x"});
  EXPECT_LT(long_name.err.size(), 600u) << "cut to a line's worth";
  EXPECT_EQ(long_name.err.find('\x1b'), std::string::npos);
  testing::GgufBuilder nan_eps;
  nan_eps.Str("general.architecture", "llama")
      .U32("llama.block_count", 1)
      .U32("llama.embedding_length", 64)
      .U32("llama.feed_forward_length", 128)
      .U32("llama.attention.head_count", 1)
      .U32("llama.context_length", 64)
      .F32("llama.attention.layer_norm_rms_epsilon", std::nanf(""));
  ExpectOneLineError({"run", "--model", WriteTemp("nan.gguf", nan_eps.Build()), "--prompt", "x"},
                     "'llama.attention.layer_norm_rms_epsilon' = nan must be a finite number > 0");
  testing::GgufBuilder missing;
  missing.Str("general.architecture", "llama").U32("llama.block_count", 1);
  const std::vector<std::string> missing_args = {
      "run", "--model", WriteTemp("missing.gguf", missing.Build()), "--prompt", "x"};
  ExpectOneLineError(missing_args, "missing key 'llama.embedding_length'");
  // A malformed file, as a wrong type is: exit 2, not 1 (not found), and no hint to pull a model.
  const Result m = Kvmesh(missing_args);
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_EQ(m.err.find("model pull"), std::string::npos) << m.err;
}

// A later request of a batch rejected at submit: one line and a clean exit, not a crash in the
// teardown (the queued requests' callbacks outlived the batch's results: a use after free,
// which crashed for a 5 MB second prompt and is not caught every time without a sanitizer).
TEST(Cli, BatchWithARejectedLaterRequestFailsCleanly) {
  KVMESH_REQUIRE_MODEL(model);
  const std::string prompts =
      WriteTemp("batch.txt", "hi\none two three four five six seven eight nine ten\n");
  const Result r = Kvmesh(
      {"run", "--model", model, "--ctx-size", "8", "--max-tokens", "1", "--prompts", prompts});
  EXPECT_TRUE(r.code == 1 || r.code == 2) << "exit " << r.code << ", stderr: " << r.err;
  EXPECT_NE(r.err.find("request 2: "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // A text file whose first prompt begins with '[' is read as lines, not refused as JSON.
  const Result br = Kvmesh({"run", "--model", model, "--max-tokens", "1", "--prompts",
                            WriteTemp("brackets.txt", "[a] first\n[b] second\n")});
  EXPECT_EQ(br.code, 0) << br.err;
  EXPECT_EQ(std::count(br.out.begin(), br.out.end(), '\n'), 2) << br.out;
  // More prompts than the waiting queue holds run in waves instead of failing.
  const Result w = Kvmesh({"run", "--model", model, "--max-tokens", "1", "--max-waiting", "1",
                           "--prompts", WriteTemp("three.txt", "a\nb\nc\n")});
  EXPECT_EQ(w.code, 0) << w.err;
  EXPECT_EQ(std::count(w.out.begin(), w.out.end(), '\n'), 3) << w.out;
}

TEST(Cli, PromptLongerThanContext) {
  KVMESH_REQUIRE_MODEL(model);
  ExpectOneLineError({"run", "--model", model, "--ctx-size", "8", "--prompt",
                      "one two three four five six seven eight nine ten"},
                     "does not fit the context size 8");
  // A context past the model's is refused, not cut to it without a word.
  ExpectOneLineError({"run", "--model", model, "--ctx-size", "100000", "--prompt", "x"},
                     "context size 100000 is more than the model's 8192 tokens");
  // So is a KV pool past the machine's memory (mapped without reserving it, it would only fail
  // once traffic filled it).
  ExpectOneLineError({"run", "--model", model, "--kv-cache-mem", "1048576", "--prompt", "x"},
                     "KV cache memory 1048576 MiB is more than this machine's");
}

TEST(Cli, RealModelCommands) {
  KVMESH_REQUIRE_MODEL(model);
  const Result chat = Kvmesh({"run", "--model", model, "--chat", "--prompt",
                              "What is the capital of France?", "--temperature", "0"});
  ASSERT_EQ(chat.code, 0) << chat.err;
  EXPECT_EQ(chat.out, "The capital of France is Paris.\n");

  const Result js = Kvmesh({"run", "--model", model, "--prompt", "Hello", "--max-tokens", "5",
                            "--temperature", "0.7", "--seed", "3", "--json"});
  ASSERT_EQ(js.code, 0) << js.err;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j.at("tokens").size(), 5u);
  EXPECT_EQ(j.at("prompt_ids"), nlohmann::json({19556}));
  EXPECT_TRUE(j.at("isa") == "amx" || j.at("isa") == "avx512" || j.at("isa") == "avx2" ||
              j.at("isa") == "scalar");
  EXPECT_GT(j.at("decode_tokens_per_s").get<double>(), 0.0);
  EXPECT_EQ(j.at("repacked").get<bool>(), kernels::PackedKernelIsFast());
  EXPECT_EQ(j.at("packed_weight_bytes").get<int64_t>() > 0, kernels::PackedKernelIsFast());
  // --no-repack: the file's row-major weights; the same greedy answer on the real model.
  const Result rows =
      Kvmesh({"run", "--model", model, "--chat", "--prompt", "What is the capital of France?",
              "--temperature", "0", "--no-repack", "--json"});
  ASSERT_EQ(rows.code, 0) << rows.err;
  EXPECT_FALSE(nlohmann::json::parse(rows.out).at("repacked").get<bool>());
  EXPECT_EQ(nlohmann::json::parse(rows.out).at("packed_weight_bytes").get<int64_t>(), 0);
  EXPECT_EQ(nlohmann::json::parse(rows.out).at("text"), "The capital of France is Paris.");
  const Result again = Kvmesh({"run", "--model", model, "--prompt", "Hello", "--max-tokens", "5",
                               "--temperature", "0.7", "--seed", "3", "--json"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out).at("tokens"), j.at("tokens"));  // same seed
  EXPECT_EQ(nlohmann::json::parse(again.out).at("text"), j.at("text"));

  // No token asked for: the prompt is still computed, and all of the time is prefill.
  const Result none =
      Kvmesh({"run", "--model", model, "--prompt", "Hello there", "--max-tokens", "0", "--json"});
  ASSERT_EQ(none.code, 0) << none.err;
  const nlohmann::json nj = nlohmann::json::parse(none.out);
  EXPECT_TRUE(nj.at("tokens").empty());
  EXPECT_GT(nj.at("prefill_ms").get<double>(), 0.0);
  EXPECT_EQ(nj.at("decode_ms").get<double>(), 0.0);
  EXPECT_GT(nj.at("prefill_tokens_per_s").get<double>(), 0.0);
  const Result none_turn = Kvmesh({"run", "--model", model, "--max-tokens", "0", "--json",
                                   "--session", WriteTemp("session_none.txt", "Hello there\n")});
  ASSERT_EQ(none_turn.code, 0) << none_turn.err;
  EXPECT_EQ(nlohmann::json::parse(none_turn.out).at("decode_ms").get<double>(), 0.0);

  // A two-turn session (one turn per line): the second turn reuses the first turn's KV.
  const Result ses =
      Kvmesh({"run", "--model", model, "--temperature", "0", "--max-tokens", "12", "--session",
              WriteTemp("session.txt", "Name a colour.\nAnother one?\n")});
  ASSERT_EQ(ses.code, 0) << ses.err;
  EXPECT_NE(ses.out.find("[turn 1] "), std::string::npos) << ses.out;
  EXPECT_NE(ses.out.find(" 0 cached"), std::string::npos) << ses.out;
  const size_t t2 = ses.out.find("[turn 2] ");
  ASSERT_NE(t2, std::string::npos) << ses.out;
  const size_t comma = ses.out.find(" prompt tokens, ", t2);
  ASSERT_NE(comma, std::string::npos);
  EXPECT_GT(std::stoi(ses.out.substr(comma + 16)), 20) << ses.out;  // cached tokens of turn 2
  // Each turn's TTFT in milliseconds with one decimal.
  EXPECT_TRUE(
      std::regex_search(ses.out, std::regex(R"(\[turn 2\] .* cached, TTFT [0-9]+\.[0-9] ms\n)")))
      << ses.out;
  // The same file with CRLF line ends: the same turns (no '\r' in the prompts), the same output.
  const Result crlf =
      Kvmesh({"run", "--model", model, "--temperature", "0", "--max-tokens", "12", "--session",
              WriteTemp("session_crlf.txt", "Name a colour.\r\nAnother one?\r\n")});
  ASSERT_EQ(crlf.code, 0) << crlf.err;
  auto without_times = [](std::string s) {  // the TTFT differs run to run
    for (size_t at; (at = s.find("TTFT ")) != std::string::npos;) {
      s.erase(at, s.find(" ms", at) + 3 - at);
    }
    return s;
  };
  EXPECT_EQ(without_times(crlf.out), without_times(ses.out));

  const Result tok = Kvmesh({"tokenize", "--model", model, "--text", "Hello world 42<|im_end|>"});
  ASSERT_EQ(tok.code, 0) << tok.err;
  EXPECT_EQ(tok.out, "[19556,905,216,36,34,2]\n");

  const Result lg =
      Kvmesh({"logits", "--model", model, "--prompt", "The capital of France is", "--top-k", "5"});
  ASSERT_EQ(lg.code, 0) << lg.err;
  const auto l = nlohmann::json::parse(lg.out);
  ASSERT_EQ(l.size(), 5u);
  for (size_t i = 1; i < l.size(); ++i) EXPECT_GE(l[i - 1][1].get<double>(), l[i][1].get<double>());
}

}  // namespace
}  // namespace kvmesh
