#include "bench/llama_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>

#include "bench/median.h"
#include "bench/membw.h"
#include "kernels/isa.h"
#include "kernels/thread_pool.h"
#include "kvstore/block_arena.h"
#include "model/llama_model.h"
#include "util/str_cat.h"
#include "worker/llama_forward.h"

namespace kvmesh::bench {
namespace {

// One sequence over its own arena (blocks 0, 1, ... in order), pre-faulted so page faults are
// not timed: what a warm server's pool looks like.
class OneSequence {
 public:
  absl::Status Init(const kvstore::KvBlockShape& shape, int64_t positions) {
    const int64_t n = (positions + shape.block_size - 1) / shape.block_size;
    auto a = kvstore::KvBlockArena::Create(shape, static_cast<int32_t>(n));
    if (!a.ok()) return a.status();
    arena_ = std::move(*a);
    std::memset(arena_->block(0), 0, static_cast<size_t>(n * shape.block_bytes()));
    for (int32_t b = 0; b < n; ++b) table_.push_back(b);
    return absl::OkStatus();
  }
  absl::Status Forward(worker::LlamaForward& fwd, std::span<const int32_t> tokens,
                       std::span<float> logits) {
    worker::StepPlan plan;
    plan.seqs.push_back({static_cast<int32_t>(tokens.size()), pos_, !logits.empty(), table_});
    plan.tokens.assign(tokens.begin(), tokens.end());
    pos_ += static_cast<int32_t>(tokens.size());
    return fwd.Forward(plan, *arena_, logits);
  }

 private:
  std::unique_ptr<kvstore::KvBlockArena> arena_;
  std::vector<int32_t> table_;
  int32_t pos_ = 0;
};

double RssMib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Bytes of weights one decode step reads: every matrix, the embedding row, the norms.
double WeightBytesPerToken(const model::LlamaModel& m) {
  const auto& c = m.config();
  auto bytes = [](const kernels::WeightMatrix& w) { return double(w.rows) * w.row_bytes; };
  double b = m.tok_embd().row_bytes + bytes(m.output()) + 4.0 * c.n_embd;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto& L = m.layer(l);
    b += bytes(L.wq) + bytes(L.wk) + bytes(L.wv) + bytes(L.wo) + bytes(L.w_gate) + bytes(L.w_up) +
         bytes(L.w_down) + 2 * 4.0 * c.n_embd;
  }
  return b;
}

void Summarise(BenchResult& r) {
  std::vector<double> s = r.samples_ts;
  std::sort(s.begin(), s.end());
  r.median_ts = Median(s);
  r.mean_ts = std::accumulate(s.begin(), s.end(), 0.0) / s.size();
  double var = 0;
  for (double x : s) var += (x - r.mean_ts) * (x - r.mean_ts);
  r.stddev_ts = s.size() > 1 ? std::sqrt(var / (s.size() - 1)) : 0.0;
}

void Print(const BenchResult& r, const model::LlamaModel& m, bool json) {
  if (json) {
    nlohmann::json j = {{"test", r.test},
                        {"threads", r.threads},
                        {"n_prompt", r.n_prompt},
                        {"n_gen", r.n_gen},
                        {"depth", r.depth},
                        {"samples_ts", r.samples_ts},
                        {"median_ts", r.median_ts},
                        {"avg_ts", r.mean_ts},
                        {"stddev_ts", r.stddev_ts},
                        {"bytes_per_token", r.bytes_per_token},
                        {"bandwidth_gbps", r.bandwidth_gbps},
                        {"bound_ts", r.bound_ts},
                        {"rss_mib", r.rss_mib},
                        {"rss_budget_mib", r.rss_budget_mib},
                        {"model_mib", r.model_mib},
                        {"kv_mib", r.kv_mib},
                        {"isa", std::string(kernels::IsaName(kernels::ActiveIsa()))},
                        {"model", m.config().name}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string bound;
    if (r.bound_ts > 0) {
      bound = StrCat(" | ", static_cast<int>(r.bound_ts), " t/s bound (",
                     static_cast<int>(100 * r.median_ts / r.bound_ts), "%)");
    }
    std::printf("| %-14s | %7d | %-6s | %9.2f ± %7.2f | %9.2f | RSS %.0f of %.0f MiB%s\n",
                r.test.c_str(), r.threads,
                std::string(kernels::IsaName(kernels::ActiveIsa())).c_str(), r.median_ts,
                r.stddev_ts, r.mean_ts, r.rss_mib, r.rss_budget_mib, bound.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

absl::StatusOr<std::vector<BenchResult>> RunBench(const BenchOptions& o) {
  auto model = model::LlamaModel::Load(o.model_path);
  if (!model.ok()) return model.status();
  const model::LlamaModel& m = **model;
  const auto& c = m.config();
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.n_vocab - 1));
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = tok(rng);
    return t;
  };
  const double weight_bytes = WeightBytesPerToken(m);
  if (!o.json) {
    std::printf("model: %s (%.1f MiB file), %lld layers, ISA %s\n", c.name.c_str(),
                m.gguf().file_size() / 1048576.0, static_cast<long long>(c.n_layers),
                std::string(kernels::IsaName(kernels::ActiveIsa())).c_str());
    std::printf("| %-14s | %7s | %-6s | %19s | %9s |\n", "test", "threads", "isa",
                "t/s median ± sd", "t/s mean");
  }
  std::vector<BenchResult> results;
  for (int threads : o.threads) {
    kernels::ThreadPool pool(threads);
    worker::LlamaForward fwd(m, pool);
    const kvstore::KvBlockShape shape{c.n_layers, c.n_kv_heads, c.head_dim, 16};
    double gbps = 0;
    if (o.bandwidth) gbps = MeasureReadBandwidth(threads).median_gbps;
    for (int depth : o.depth) {
      auto run = [&](int n_prompt, int n_gen) -> absl::StatusOr<double> {
        const int64_t need = depth + n_prompt + n_gen + 1;
        if (need > c.n_ctx_train) {
          return absl::InvalidArgumentError(
              StrCat("depth + tokens = ", need, " exceeds the model context ", c.n_ctx_train));
        }
        OneSequence seq;
        if (auto s = seq.Init(shape, need); !s.ok()) return s;
        std::vector<float> logits(c.n_vocab);
        if (depth > 0) {
          if (auto s = seq.Forward(fwd, random_tokens(depth), {}); !s.ok()) return s;
        }
        const auto prompt = random_tokens(std::max(n_prompt, 1));
        const auto t0 = std::chrono::steady_clock::now();
        if (n_prompt > 0) {
          if (auto s = seq.Forward(fwd, prompt, logits); !s.ok()) return s;
        }
        int32_t next = prompt[0];
        for (int i = 0; i < n_gen; ++i) {
          const int32_t one[1] = {next};
          if (auto s = seq.Forward(fwd, one, logits); !s.ok()) return s;
          next = tok(rng);
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      std::vector<std::pair<int, int>> tests;
      for (int p : o.n_prompt) {
        if (p > 0) tests.push_back({p, 0});
      }
      for (int g : o.n_gen) {
        if (g > 0) tests.push_back({0, g});
      }
      for (auto [p, g] : tests) {
        BenchResult r;
        r.threads = threads;
        r.n_prompt = p;
        r.n_gen = g;
        r.depth = depth;
        r.test = p > 0 ? StrCat("pp", p) : StrCat("tg", g);
        if (depth > 0) r.test += StrCat(" @ d", depth);
        if (auto w = run(p, g); !w.ok()) return w.status();  // warm-up
        for (int i = 0; i < o.reps; ++i) {
          auto secs = run(p, g);
          if (!secs.ok()) return secs.status();
          r.samples_ts.push_back((p + g) / *secs);
        }
        Summarise(r);
        r.rss_mib = RssMib();
        r.kv_mib = double(depth + p + g + 1) * shape.bytes_per_token() / 1048576.0;
        r.model_mib = m.gguf().file_size() / 1048576.0;
        r.rss_budget_mib = r.model_mib + r.kv_mib + 64.0;
        if (g > 0) {
          // Per token: the weights, plus K and V of every cached position (average depth).
          r.bytes_per_token = weight_bytes + (depth + g / 2.0) * shape.bytes_per_token();
          r.bandwidth_gbps = gbps;
          if (gbps > 0) r.bound_ts = gbps * 1e9 / r.bytes_per_token;
        }
        Print(r, m, o.json);
        results.push_back(std::move(r));
      }
    }
    if (!o.json && gbps > 0)
      std::printf("  read bandwidth, %d threads: %.1f GB/s\n", threads, gbps);
  }
  return results;
}

}  // namespace kvmesh::bench
