// SCBench-style shared-context benchmark on the serving engine (in process, real model).
//
// A long context (a JSON object of UUID key/value pairs, a set of code files, or prose) of 1K,
// 4K or 8K tokens is followed by 5 queries, in two modes:
//   multi-turn    one conversation: each turn appends the previous answer and a new question;
//   multi-request the same context with independent questions, one request each.
// Each is run with prefix reuse on and off (off: every prompt computed in full), reporting TTFT
// per turn and the ratio. Then decode throughput with 1, 4 and 16 concurrent sequences over the
// same context, and the KV bytes per token.
//
//   build/bin/shared_context_bench [--model PATH] [--threads N] [--contexts 1024,4096,8192]
//       [--kind kv|code|prose] [--concurrency 1,4,16] [--decode-tokens 64] [--json]
//       [--decode-only]  (skip the TTFT runs) [--reps 3]  (decode runs per concurrency,
//       interleaved; medians reported) [--activation-bits 16|8]  (kernels/packed.h ActBits)
//       [--attention-bits 32|16]  (16: bf16 operands; worker/engine.h EngineOptions)
//       [--compare-attention]  (a second engine with bf16 attention, its decode runs interleaved
//       with the first's: both rates and their ratios from one run)
//       [--phases]  (time the forward by phase: the decode steps' mean per phase, per
//       concurrency; worker/phase_times.h)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/median.h"
#include "coordinator/flags.h"
#include "coordinator/launch.h"
#include "serving/serving_engine.h"
#include "util/str_cat.h"
#include "worker/phase_times.h"

namespace kvmesh::bench {
namespace {

using nlohmann::json;

constexpr char kUsage[] =
    "usage: shared_context_bench [--model PATH] [--threads N] [--contexts 1024,4096,8192]\n"
    "    [--kind kv|code|prose] [--concurrency 1,4,16] [--decode-tokens 64] [--reps 3]\n"
    "    [--kv-cache-mem MiB] [--activation-bits 16|8] [--attention-bits 32|16]\n"
    "    [--decode-only] [--phases] [--compare-attention] [--json]\n"
    "TTFT per turn with prefix reuse on and off (multi-turn and multi-request), then decode\n"
    "tokens/s at each concurrency over one shared context (bench/shared_context.cc).\n";
using Clock = std::chrono::steady_clock;

struct Workload {
  std::string context;
  std::vector<std::string> questions;
};

std::string Uuid(std::mt19937_64& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    s += hex[rng() % 16];
  }
  return s;
}

// Grows a context of `kind` until it has about `tokens` tokens; questions ask about items in it.
Workload Make(const std::string& kind, int tokens, const model::Tokenizer& tok, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Workload w;
  std::vector<std::string> keys, values;
  const char* colours[] = {"red", "green", "blue", "amber", "violet", "white", "black", "grey"};
  std::string body;
  int64_t counted = 0;  // tokens of the items so far, each tokenised alone (close to the whole)
  for (int i = 0; counted < tokens; ++i) {
    std::string item;
    if (kind == "kv") {
      keys.push_back(Uuid(rng));
      values.push_back(Uuid(rng));
      item = (i ? ", " : "") + std::string("\"") + keys.back() + "\": \"" + values.back() + "\"";
    } else if (kind == "code") {
      keys.push_back(StrCat("compute_", i));
      values.push_back(std::to_string(rng() % 1000));
      item = StrCat("def ", keys.back(), "(x):\n    \"\"\"Step ", i, " of the pipeline.\"\"\"\n",
                    "    return x * ", values.back(), " + ", rng() % 97, "\n\n");
    } else {
      keys.push_back(StrCat("Person ", i));
      values.push_back(colours[rng() % 8]);
      item = StrCat(keys.back(), " lives in a ", values.back(), " house on street ", rng() % 300,
                    " and walks to work every morning. ");
    }
    counted += static_cast<int64_t>(tok.Encode(item, false).size());
    body += item;
  }
  w.context = kind == "kv" ? "{" + body + "}" : body;
  for (int q = 0; q < 5; ++q) {
    const size_t i = rng() % keys.size();
    if (kind == "kv") {
      w.questions.push_back("What is the value of key \"" + keys[i] + "\"?");
    } else if (kind == "code") {
      w.questions.push_back("What does " + keys[i] + "(1) return?");
    } else {
      w.questions.push_back("What colour is the house of " + keys[i] + "?");
    }
  }
  return w;
}

struct Turn {
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double ttft_ms = 0;
};

serving::Request Req(std::vector<int32_t> prompt, int max_tokens) {
  serving::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// Runs the 5 queries in one mode; returns per-turn TTFT and cached counts.
absl::StatusOr<std::vector<Turn>> RunMode(worker::Engine& e, const Workload& w, bool multi_turn,
                                          bool reuse) {
  serving::ServingEngine se(e, {.prefix_caching = reuse});
  const model::ChatTemplate& tmpl = *e.chat_template();
  std::vector<model::ChatMessage> messages;
  std::vector<Turn> turns;
  for (size_t q = 0; q < w.questions.size(); ++q) {
    std::vector<model::ChatMessage> m;
    if (multi_turn) {
      messages.push_back({"user", q == 0 ? w.context + "\n\n" + w.questions[q] : w.questions[q]});
      m = messages;
    } else {
      m = {{"user", w.context + "\n\n" + w.questions[q]}};
    }
    serving::Request r = Req(e.tokenizer().Encode(tmpl.Render(m, true), true), 32);
    if (multi_turn) r.session_id = "bench";
    auto c = se.Generate(r);
    if (!c.ok()) return c.status();
    if (!c->status.ok()) return c->status;
    if (multi_turn) messages.push_back({"assistant", se.Text(c->tokens)});
    turns.push_back({c->prompt_tokens, c->cached_tokens, c->ttft_ms});
  }
  return turns;
}

// Decode tokens/s with n sequences over the same context, counted from the moment every
// sequence has its first token until the last one finishes. Adds the forward's phase times of
// that window to *phases.
absl::StatusOr<double> DecodeRate(worker::Engine& e, const Workload& w, int n, int tokens,
                                  worker::PhaseTimes* phases) {
  serving::ServingEngine se(e, {.max_seqs = std::max(16, n)});
  const model::ChatTemplate& tmpl = *e.chat_template();
  // Warm the context into the prefix cache first, so the decode phase starts together.
  auto warm = se.Generate(Req(
      e.tokenizer().Encode(tmpl.Render({{"user", w.context + "\n\nSummarise."}}, true), true), 1));
  if (!warm.ok()) return warm.status();
  int started = 0;
  int64_t counted = 0;
  Clock::time_point t0;
  worker::PhaseTimes at_t0;
  std::map<serving::RequestId, int> got;
  for (int i = 0; i < n; ++i) {
    serving::Request r =
        Req(e.tokenizer().Encode(
                tmpl.Render({{"user", w.context + "\n\n" + w.questions[i % w.questions.size()] +
                                          StrCat(" (variant ", i, ")")}},
                            true),
                true),
            tokens);
    r.ignore_eos = true;
    auto id = se.Submit(r, {.on_token = [&](serving::RequestId id, int32_t) {
                          if (got[id]++ == 0 && ++started == n) {
                            t0 = Clock::now();
                            at_t0 = e.phase_times();
                          }
                          if (started == n) ++counted;
                        }});
    if (!id.ok()) return id.status();
  }
  if (auto s = se.RunUntilIdle(); !s.ok()) return s;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *phases += e.phase_times().Since(at_t0);
  return static_cast<double>(counted - 1) / secs;  // the token that completed the start
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  size_t b = 0;
  while (b < s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    out.push_back(std::stoi(s.substr(b, e - b)));
    b = e + 1;
  }
  return out;
}

int Main(int argc, char** argv) {
  auto f = coordinator::Flags::Parse(
      argc, argv, 1,
      {"model", "threads", "contexts", "kind", "concurrency", "decode-tokens", "kv-cache-mem",
       "reps", "activation-bits", "attention-bits"},
      {"json", "decode-only", "phases", "compare-attention"});
  if (!f.ok()) return coordinator::Fail(f.status());
  if (f->help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  worker::EngineOptions o;
  o.model_path = coordinator::ModelPath(*f);
  o.threads = static_cast<int>(f->Int("threads", 0, 0, 1024).value_or(0));
  o.kv_cache_bytes = f->Int("kv-cache-mem", 2048, 1, 1 << 20).value_or(2048) << 20;
  o.activation_bits = static_cast<int>(f->Int("activation-bits", 16, 1, 64).value_or(16));
  o.attention_bits = static_cast<int>(f->Int("attention-bits", 32, 1, 64).value_or(32));
  o.phase_times = f->Has("phases");
  auto engine = worker::Engine::Create(o);
  if (!engine.ok()) return coordinator::Fail(engine.status());
  worker::Engine& e = **engine;
  std::unique_ptr<worker::Engine> bf16_engine;
  if (f->Has("compare-attention")) {
    worker::EngineOptions ob = o;
    ob.attention_bits = 16;
    auto b = worker::Engine::Create(ob);
    if (!b.ok()) return coordinator::Fail(b.status());
    bf16_engine = std::move(*b);
  }
  const std::string kind = f->String("kind", "kv");
  if (kind != "kv" && kind != "code" && kind != "prose") {
    return coordinator::Fail(absl::InvalidArgumentError("--kind must be kv, code or prose"));
  }
  const auto contexts = Ints(f->String("contexts", "1024,4096,8192"));
  const auto conc = Ints(f->String("concurrency", "1,4,16"));
  const int decode_tokens = static_cast<int>(f->Int("decode-tokens", 64, 1, 4096).value_or(64));
  const int reps = static_cast<int>(f->Int("reps", 3, 1, 100).value_or(3));
  const bool as_json = f->Has("json");
  json out = {{"model", e.model().config().name},
              {"threads", e.threads()},
              {"kind", kind},
              {"kv_bytes_per_token", e.kv_bytes_per_token()},
              {"activation_bits", e.activation_bits()},
              {"attention_bits", e.attention_bits()},
              {"block_size", e.block_size()}};
  if (!as_json) {
    std::printf(
        "model %s, %d threads, %d-bit activations, %s attention, context kind '%s', KV %lld "
        "bytes/token (fp16, all layers)\n",
        e.model().config().name.c_str(), e.threads(), e.activation_bits(),
        e.attention_bits() == 16 ? "bf16" : "fp32", kind.c_str(),
        static_cast<long long>(e.kv_bytes_per_token()));
  }
  for (int ctx : contexts) {
    // The whole conversation must fit the model's window: keep ~400 tokens for the chat
    // template, five questions and four answers.
    const int target = static_cast<int>(std::min<int64_t>(ctx, e.ctx_size() - 400));
    const Workload w = Make(kind, target, e.tokenizer(), 1234 + ctx);
    for (bool multi_turn : {true, false}) {
      if (f->Has("decode-only")) break;
      const char* mode = multi_turn ? "multi-turn" : "multi-request";
      auto on = RunMode(e, w, multi_turn, true);
      if (!on.ok()) return coordinator::Fail(on.status());
      auto off = RunMode(e, w, multi_turn, false);
      if (!off.ok()) return coordinator::Fail(off.status());
      if (!as_json) {
        std::printf(
            "\n%s, %d-token context:\n| turn | prompt tokens | cached | TTFT on ms | TTFT off ms | "
            "off/on |\n|---|---|---|---|---|---|\n",
            mode, ctx);
      }
      std::vector<double> ratios;
      for (size_t t = 0; t < on->size(); ++t) {
        const Turn& a = (*on)[t];
        const Turn& b = (*off)[t];
        const double ratio = b.ttft_ms / a.ttft_ms;
        if (t > 0) ratios.push_back(ratio);
        if (!as_json) {
          std::printf("| %zu | %lld | %lld | %.1f | %.1f | %.1fx |\n", t + 1,
                      static_cast<long long>(a.prompt_tokens),
                      static_cast<long long>(a.cached_tokens), a.ttft_ms, b.ttft_ms, ratio);
        }
        out["ttft"].push_back({{"context", ctx},
                               {"mode", mode},
                               {"turn", t + 1},
                               {"prompt_tokens", a.prompt_tokens},
                               {"cached_tokens", a.cached_tokens},
                               {"ttft_on_ms", a.ttft_ms},
                               {"ttft_off_ms", b.ttft_ms}});
      }
      if (!as_json) {
        std::printf("median TTFT ratio (off/on) over turns 2-%zu: %.1fx\n", on->size(),
                    bench::Median(ratios));
      }
    }
    // Repetitions interleave the concurrencies (1, 4, 16, 1, 4, 16, ...), so drift of the
    // machine touches every column alike; medians and ratios of medians are reported.
    // With --compare-attention the bf16 engine's run follows each of the first engine's.
    std::map<int, std::vector<double>> rates, rates_b;
    std::map<int, worker::PhaseTimes> phases, phases_b;
    for (int rep = 0; rep < reps; ++rep) {
      for (int n : conc) {
        auto rate = DecodeRate(e, w, n, decode_tokens, &phases[n]);
        if (!rate.ok()) return coordinator::Fail(rate.status());
        rates[n].push_back(*rate);
        if (bf16_engine == nullptr) continue;
        auto rb = DecodeRate(*bf16_engine, w, n, decode_tokens, &phases_b[n]);
        if (!rb.ok()) return coordinator::Fail(rb.status());
        rates_b[n].push_back(*rb);
      }
    }
    const double single = rates.count(1) ? bench::Median(rates[1]) : 0;
    for (int n : conc) {
      const double m = bench::Median(rates[n]);
      const auto [lo, hi] = std::minmax_element(rates[n].begin(), rates[n].end());
      if (!as_json) {
        std::printf(
            "decode, %2d concurrent sequences over the %d-token context: %.1f tokens/s (median of "
            "%d, %.1f-%.1f)%s\n",
            n, ctx, m, reps, *lo, *hi,
            single > 0 && n > 1 ? StrCat(", ", m / single, "x one sequence").c_str() : "");
      }
      json row = {{"context", ctx}, {"sequences", n}, {"tokens_per_s", m}, {"samples", rates[n]}};
      if (const worker::PhaseTimes& p = phases[n]; o.phase_times && p.forwards > 0) {
        // Mean ms per decode step by phase (over every repetition's window).
        std::string line;
        for (int i = 0; i < worker::kPhases; ++i) {
          const auto ph = static_cast<worker::Phase>(i);
          const double ms = 1e3 * p[ph] / static_cast<double>(p.forwards);
          row["step_ms"][worker::PhaseName(ph)] = ms;
          line += StrCat(i > 0 ? ", " : "", worker::PhaseName(ph), " ", Fixed(ms, 2));
        }
        const double step_ms = 1e3 * p.total() / static_cast<double>(p.forwards);
        row["step_ms"]["total"] = step_ms;
        if (!as_json) {
          std::printf("  per step (ms, mean of %lld steps): %s; forward %s\n",
                      static_cast<long long>(p.forwards), line.c_str(), Fixed(step_ms, 2).c_str());
        }
      }
      out["decode"].push_back(row);
    }
    if (bf16_engine != nullptr) {
      const double single_b = rates_b.count(1) ? bench::Median(rates_b[1]) : 0;
      for (int n : conc) {
        const double m = bench::Median(rates_b[n]), m_a = bench::Median(rates[n]);
        const auto [lo, hi] = std::minmax_element(rates_b[n].begin(), rates_b[n].end());
        if (!as_json) {
          std::printf(
              "decode, %2d concurrent sequences, bf16 attention: %.1f tokens/s (median of %d, "
              "%.1f-%.1f), %.3fx the default's%s\n",
              n, m, reps, *lo, *hi, m / m_a,
              single > 0 && single_b > 0 && n > 1
                  ? StrCat("; ", m / single_b, "x one bf16 sequence, ", m / single,
                           "x one default sequence")
                        .c_str()
                  : "");
        }
        json row = {{"context", ctx},    {"sequences", n},        {"attention_bits", 16},
                    {"tokens_per_s", m}, {"samples", rates_b[n]}, {"vs_default", m / m_a}};
        if (const worker::PhaseTimes& p = phases_b[n]; o.phase_times && p.forwards > 0) {
          const double attn = 1e3 * p[worker::Phase::kAttention] / static_cast<double>(p.forwards);
          const double step = 1e3 * p.total() / static_cast<double>(p.forwards);
          row["step_ms"] = {{"attention", attn}, {"total", step}};
          if (!as_json) {
            std::printf("  per step (ms, mean of %lld steps): attention %s; forward %s\n",
                        static_cast<long long>(p.forwards), Fixed(attn, 2).c_str(),
                        Fixed(step, 2).c_str());
          }
        }
        out["decode"].push_back(row);
      }
    }
  }
  if (as_json) std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kvmesh::bench

int main(int argc, char** argv) { return kvmesh::bench::Main(argc, argv); }
