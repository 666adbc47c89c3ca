#include "coordinator/cli.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "bench/llama_bench.h"
#include "comm/mpi/mpi_communicator.h"
#include "coordinator/client_cli.h"
#include "coordinator/flags.h"
#include "coordinator/launch.h"
#include "coordinator/serve.h"
#include "coordinator/texts_file.h"
#include "coordinator/usage.h"
#include "kernels/isa.h"
#include "model/shard.h"
#include "serving/serving_engine.h"
#include "util/printable.h"
#include "util/str_cat.h"
#include "util/utf8.h"
#include "worker/engine.h"

#ifndef KVMESH_SCRIPTS_DIR
#define KVMESH_SCRIPTS_DIR "scripts"
#endif

namespace kvmesh::coordinator {
namespace {

using nlohmann::json;

const std::set<std::string>& kLaunchFlags = LaunchFlagNames();

std::set<std::string> With(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

int RunLeader(const Flags& f, serving::ServingEngine& se, serving::Request req);

// A completion's prefill time: its time to first token or, with no token generated, all of it.
double PrefillMs(const serving::Completion& c) { return c.tokens.empty() ? c.total_ms : c.ttft_ms; }

// Runs each turn as the next user message of one conversation, reusing the KV of everything
// the previous turns computed (unless --no-prefix-reuse), and prints each answer with its
// time to first token and the number of prompt tokens served from the cache.
int SessionLeader(const Flags& f, serving::ServingEngine& se, serving::Request req,
                  const std::vector<std::string>& turns) {
  worker::Engine& e = se.engine();
  const model::ChatTemplate* tmpl = e.chat_template();
  if (tmpl == nullptr)
    return Fail(absl::FailedPreconditionError("--session needs a model with a chat template"));
  req.session_id = "cli";
  std::vector<model::ChatMessage> messages;
  for (size_t i = 0; i < turns.size(); ++i) {
    messages.push_back({"user", turns[i]});
    req.prompt = e.tokenizer().Encode(tmpl->Render(messages, true), /*parse_special=*/true);
    auto r = se.Generate(req);
    if (!r.ok()) return Fail(r.status());
    if (!r->status.ok()) return Fail(r->status);
    const std::string text = se.Text(r->tokens);
    messages.push_back({"assistant", text});
    if (f.Has("json")) {
      json j = {{"turn", i + 1},
                {"prompt_tokens", r->prompt_tokens},
                {"cached_tokens", r->cached_tokens},
                {"ttft_ms", r->ttft_ms},
                {"tokens", r->tokens},
                {"decode_ms", r->total_ms - PrefillMs(*r)}};
      j["text"] = text;
      std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    } else {
      std::cout << "[turn " << i + 1 << "] " << r->prompt_tokens << " prompt tokens, "
                << r->cached_tokens << " cached, TTFT " << Fixed(r->ttft_ms) << " ms\n"
                << text << "\n";
    }
  }
  return 0;
}

// Independent requests submitted together (continuous batching, shared prefixes reused): one
// JSON line per request, in input order, and the engine's counters on stderr.
int BatchLeader(const Flags& f, serving::ServingEngine& se, serving::Request req,
                const std::vector<std::string>& prompts) {
  worker::Engine& e = se.engine();
  if (f.Has("test-preempt")) {
    auto p = f.Float("test-preempt", 0, 0, 1);
    if (!p.ok()) return Fail(p.status());
    se.SetPreemptProbabilityForTesting(*p);
  }
  // Shared with the callbacks: requests still queued when this returns early are cancelled
  // later (the engine's teardown), and their callbacks must find it.
  const auto done_ptr = std::make_shared<std::vector<serving::Completion>>(prompts.size());
  std::vector<serving::Completion>& done = *done_ptr;
  const auto t0 = std::chrono::steady_clock::now();  // steps may run while submitting
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (f.Has("chat")) {
      auto p = e.ChatPrompt(prompts[i]);
      if (!p.ok()) return Fail(p.status());
      req.prompt = std::move(*p);
    } else {
      req.prompt = e.tokenizer().Encode(prompts[i], /*parse_special=*/true);
    }
    auto submit = [&] {
      return se.Submit(
          req, {.on_done = [done_ptr, i](const serving::Completion& c) { (*done_ptr)[i] = c; }});
    };
    auto id = submit();
    // More prompts than the waiting queue holds: run steps until there is room.
    while (absl::IsResourceExhausted(id.status()) && !se.idle()) {
      if (auto s = se.Step(); !s.ok()) return Fail(s);
      id = submit();
    }
    if (!id.ok())
      return Fail(
          absl::Status(id.status().code(), StrCat("request ", i + 1, ": ", id.status().message())));
  }
  if (auto s = se.RunUntilIdle(); !s.ok()) return Fail(s);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < done.size(); ++i) {
    const serving::Completion& c = done[i];
    if (!c.status.ok()) return Fail(c.status);
    json j = {{"request", i + 1},
              {"prompt_tokens", c.prompt_tokens},
              {"cached_tokens", c.cached_tokens},
              {"preemptions", c.preemptions},
              {"ttft_ms", c.ttft_ms},
              {"total_ms", c.total_ms},
              {"stop_reason", c.stop_reason},
              {"tokens", c.tokens}};
    j["text"] = se.Text(c.tokens);
    std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  }
  const auto st = se.stats();
  if (se.replicas() > 1) {
    std::cerr << "kvmesh: requests per data-parallel replica:";
    for (int r = 0; r < se.replicas(); ++r) std::cerr << " " << se.scheduler(r).stats().submitted;
    std::cerr << "\n";
  }
  std::cerr << "kvmesh: " << done.size() << " requests in " << st.steps << " steps; prefix cache "
            << st.prefix_hit_tokens << "/" << st.prefix_query_tokens << " prompt tokens; "
            << st.preemptions << " preemptions; KV blocks " << st.blocks_used << " used, "
            << st.blocks_cached << " cached, " << st.blocks_free << " free, " << st.blocks_total
            << " total; TTFT p50 " << Fixed(se.ttft_seconds().Quantile(0.5) * 1e3) << " ms; "
            << st.generated_tokens << " tokens generated in " << Fixed(wall_s * 1e3) << " ms ("
            << Fixed(static_cast<double>(st.generated_tokens) / wall_s) << " tokens/s)\n";
  return 0;
}

int Run(int argc, char** argv) {
  auto f = Flags::Parse(
      argc, argv, 2,
      With(kLaunchFlags, {"model", "prompt", "max-tokens", "temperature", "top-k", "top-p",
                          "repeat-penalty", "seed", "session", "prompts", "test-preempt"}),
      {"chat", "json", "print-plan", "ignore-eos", "no-prefix-reuse", "no-repack"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  if (f->Has("prompt") + f->Has("session") + f->Has("prompts") != 1) {
    return Fail(
        absl::InvalidArgumentError("run: give exactly one of --prompt, --session and --prompts"));
  }
  std::vector<std::string> turns;
  for (const char* name : {"session", "prompts"}) {
    if (!f->Has(name)) continue;
    auto t = ReadTexts(StrCat("--", name), f->String(name, ""));
    if (!t.ok()) return Fail(t.status());
    turns = std::move(*t);
  }
  serving::Request req;
  auto max_tokens = f->Int("max-tokens", 256, 0, 1 << 24);
  auto temp = f->Float("temperature", 0.8, 0.0, 100.0);
  auto top_k = f->Int("top-k", 40, 0, 1 << 24);
  auto top_p = f->Float("top-p", 0.95, 1e-6, 1.0);
  auto rep = f->Float("repeat-penalty", 1.0, 1e-3, 100.0);
  auto seed = f->Uint64("seed", 0);
  for (const absl::Status& s : {max_tokens.status(), temp.status(), top_k.status(), top_p.status(),
                                rep.status(), seed.status()}) {
    if (!s.ok()) return Fail(s);
  }
  req.max_tokens = static_cast<int32_t>(*max_tokens);
  req.sampling.temperature = static_cast<float>(*temp);
  req.sampling.top_k = static_cast<int32_t>(*top_k);
  req.sampling.top_p = static_cast<float>(*top_p);
  req.sampling.repeat_penalty = static_cast<float>(*rep);
  req.sampling.seed = *seed;
  req.ignore_eos = f->Has("ignore-eos");
  Launch launch;
  if (auto s = SetUp(*f, launch); !s.ok()) return Fail(s);
  if (f->Has("prompts")) {
    return RunLaunched(launch, [&] { return BatchLeader(*f, *launch.serving, req, turns); });
  }
  if (!turns.empty()) {
    return RunLaunched(launch, [&] { return SessionLeader(*f, *launch.serving, req, turns); });
  }
  return RunLaunched(launch, [&] { return RunLeader(*f, *launch.serving, req); });
}

int RunLeader(const Flags& f, serving::ServingEngine& se, serving::Request req) {
  worker::Engine& e = se.engine();
  const std::string prompt = f.String("prompt", "");
  if (f.Has("chat")) {
    auto p = e.ChatPrompt(prompt);
    if (!p.ok()) return Fail(p.status());
    req.prompt = std::move(*p);
  } else {
    req.prompt = e.tokenizer().Encode(prompt, /*parse_special=*/true);
  }
  const bool as_json = f.Has("json");
  // Stream text as it is generated, holding back bytes of an incomplete UTF-8 character.
  std::string pending;
  auto on_token = [&](int32_t id) {
    if (as_json) return;
    pending += e.tokenizer().TokenBytes(id);
    const size_t n = CompleteUtf8Prefix(pending);
    std::cout << pending.substr(0, n) << std::flush;
    pending.erase(0, n);
  };
  const worker::CommStats comm0 = e.comm_stats();
  auto r = se.Generate(req, on_token);
  if (!r.ok()) return Fail(r.status());
  if (!r->status.ok()) return Fail(r->status);
  const double prefill_ms = PrefillMs(*r);
  const double decode_ms = r->total_ms - prefill_ms;
  const std::string text = se.Text(r->tokens);
  if (as_json) {
    json j;
    j["text"] = json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
    j["prompt_tokens"] = r->prompt_tokens;
    j["prompt_ids"] = req.prompt;
    j["tokens"] = r->tokens;
    j["stop_reason"] = r->stop_reason;
    j["prefill_ms"] = prefill_ms;
    j["decode_ms"] = decode_ms;
    const double n_dec = r->tokens.size() > 1 ? static_cast<double>(r->tokens.size() - 1) : 0.0;
    j["prefill_tokens_per_s"] = prefill_ms > 0 ? r->prompt_tokens * 1000.0 / prefill_ms : 0.0;
    j["decode_tokens_per_s"] = decode_ms > 0 ? n_dec * 1000.0 / decode_ms : 0.0;
    j["threads"] = e.threads();
    j["tp"] = e.shard().tp_size;
    // This run's TP collectives on the leader (see worker::CommStats).
    const worker::CommStats& comm = e.comm_stats();
    j["comm_ms"] = (comm.total_s() - comm0.total_s()) * 1e3;
    j["allreduce_ms"] = (comm.allreduce_s - comm0.allreduce_s) * 1e3;
    j["allreduce_wait_ms"] = (comm.allreduce_wait_s - comm0.allreduce_wait_s) * 1e3;
    j["allreduces"] = comm.allreduces - comm0.allreduces;
    j["gather_ms"] = (comm.gather_s - comm0.gather_s) * 1e3;
    j["gather_wait_ms"] = (comm.gather_wait_s - comm0.gather_wait_s) * 1e3;
    j["gathers"] = comm.gathers - comm0.gathers;
    j["isa"] = std::string(kernels::IsaName(kernels::ActiveIsa()));
    j["activation_bits"] = e.activation_bits();
    j["attention_bits"] = e.attention_bits();
    j["repacked"] = e.repacked();
    j["packed_weight_bytes"] = e.packed_weight_bytes();
    j["model"] = e.model().config().name;
    std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  } else {
    std::cout << pending << "\n";
    std::cerr << "kvmesh: " << r->prompt_tokens << " prompt token"
              << (r->prompt_tokens == 1 ? "" : "s") << " in " << Fixed(prefill_ms) << " ms, "
              << r->tokens.size() << " generated in " << Fixed(decode_ms) << " ms ("
              << r->stop_reason << ", " << e.threads() << " threads, "
              << kernels::IsaName(kernels::ActiveIsa())
              << (e.activation_bits() == 8 ? ", 8-bit activations" : "")
              << (e.attention_bits() == 16 ? ", bf16 attention" : "")
              << (e.repacked() ? ", weights repacked: " +
                                     std::to_string(e.packed_weight_bytes() >> 20) + " MiB"
                               : ", row-major weights")
              << ")\n";
  }
  return 0;
}

int Tokenize(int argc, char** argv) {
  auto f = Flags::Parse(argc, argv, 2, {"model", "text"}, {"no-special"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  if (!f->Has("text")) return Fail(absl::InvalidArgumentError("tokenize: --text is required"));
  auto gguf = model::GgufFile::Open(ModelPath(*f));
  if (!gguf.ok()) return Fail(gguf.status());
  auto tok = model::Tokenizer::FromGguf(**gguf);
  if (!tok.ok()) return Fail(tok.status());
  std::cout << json((*tok)->Encode(f->String("text", ""), !f->Has("no-special"))).dump() << "\n";
  return 0;
}

int LogitsLeader(const Flags& f, serving::ServingEngine& se, int64_t k);

int Logits(int argc, char** argv) {
  auto f = Flags::Parse(argc, argv, 2, With(kLaunchFlags, {"model", "prompt", "top-k"}),
                        {"print-plan", "no-repack"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  if (!f->Has("prompt")) return Fail(absl::InvalidArgumentError("logits: --prompt is required"));
  auto k = f->Int("top-k", 20, 1, 1 << 24);
  if (!k.ok()) return Fail(k.status());
  Launch launch;
  if (auto s = SetUp(*f, launch); !s.ok()) return Fail(s);
  return RunLaunched(launch, [&] { return LogitsLeader(*f, *launch.serving, *k); });
}

int LogitsLeader(const Flags& f, serving::ServingEngine& se, int64_t k) {
  const auto ids = se.engine().tokenizer().Encode(f.String("prompt", ""), /*parse_special=*/true);
  auto logits = se.LastLogits(ids);
  if (!logits.ok()) return Fail(logits.status());
  std::vector<int32_t> idx(logits->size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t top = std::min<size_t>(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + top, idx.end(),
                    [&](int32_t a, int32_t b) { return (*logits)[a] > (*logits)[b]; });
  json out = json::array();
  for (size_t i = 0; i < top; ++i) out.push_back({idx[i], (*logits)[idx[i]]});
  std::cout << out.dump() << "\n";
  return 0;
}

absl::StatusOr<std::vector<int>> IntList(const Flags& f, const std::string& name,
                                         std::vector<int> dflt, int lo, int hi) {
  if (!f.Has(name)) return dflt;
  std::vector<int> out;
  const std::string s = f.String(name, "");
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    const std::string item = s.substr(b, e - b);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < lo || v > hi) {
      return absl::InvalidArgumentError(StrCat(f.Spelling(name),
                                               " must be a comma-separated list of integers in [",
                                               lo, ", ", hi, "], got '", s, "'"));
    }
    out.push_back(static_cast<int>(v));
    b = e + 1;
  }
  return out;
}

int Bench(int argc, char** argv) {
  // llama-bench spells its flags with one dash; both spellings are accepted.
  // -m is llama-bench's name for the model file.
  auto f = Flags::Parse(argc, argv, 2, {"model", "m", "p", "n", "t", "d", "r"},
                        {"json", "no-bandwidth"}, {"m", "p", "n", "t", "d", "r"});
  if (!f.ok()) return Fail(f.status());
  if (f->help()) return PrintHelp();
  if (f->Has("m") && f->Has("model")) {
    return Fail(absl::InvalidArgumentError("bench: give -m or --model, not both"));
  }
  if (f->Has("m")) f->Set("model", f->String("m", ""));
  bench::BenchOptions o;
  o.model_path = ModelPath(*f);
  auto p = IntList(*f, "p", {512}, 0, 1 << 20);
  auto n = IntList(*f, "n", {128}, 0, 1 << 20);
  auto t = IntList(*f, "t", {kernels::ThreadPool::AvailableCpus()}, 1, 1024);
  auto d = IntList(*f, "d", {0}, 0, 1 << 24);
  auto r = f->Int("r", 5, 1, 1000);
  for (const absl::Status& s : {p.status(), n.status(), t.status(), d.status(), r.status()}) {
    if (!s.ok()) return Fail(s);
  }
  o.n_prompt = *p;
  o.n_gen = *n;
  o.threads = *t;
  o.depth = *d;
  o.reps = static_cast<int>(*r);
  o.json = f->Has("json");
  o.bandwidth = !f->Has("no-bandwidth");
  auto res = bench::RunBench(o);
  if (!res.ok()) return Fail(res.status());
  return 0;
}

int ModelCmd(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    if (const std::string a = argv[i]; a == "--help" || a == "-h") return PrintHelp();
  }
  if (argc < 3 || std::string(argv[2]) != "pull") {
    return Fail(absl::InvalidArgumentError("model: the only subcommand is `kvmesh model pull`"));
  }
  if (argc > 3)
    return Fail(
        absl::InvalidArgumentError(StrCat("model pull: unexpected argument '", argv[3], "'")));
  const std::string script = StrCat(KVMESH_SCRIPTS_DIR, "/model_pull.sh");
  execl("/bin/bash", "bash", script.c_str(), static_cast<char*>(nullptr));
  return Fail(absl::InternalError(StrCat("cannot run ", script)));
}

}  // namespace

int CliMain(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  if (const std::string a = argv[1]; a == "help" || a == "--help" || a == "-h") return PrintHelp();
  const std::string cmd = argv[1];
  if (cmd == "run") return Run(argc, argv);
  if (cmd == "tokenize") return Tokenize(argc, argv);
  if (cmd == "logits") return Logits(argc, argv);
  if (cmd == "model") return ModelCmd(argc, argv);
  if (cmd == "bench") return Bench(argc, argv);
  if (cmd == "serve") return Serve(argc, argv);
  if (cmd == "client") return Client(argc, argv);
  std::cerr << "kvmesh: error: unknown command '" << util::Printable(cmd)
            << "' (run `kvmesh help` for usage)\n";
  return 2;
}

}  // namespace kvmesh::coordinator
