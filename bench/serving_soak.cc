// Randomised soak of the serving engine on the real model (not run in CI):
//   build/bin/serving_soak [--seconds 600] [--model PATH] [--threads N] [--kv-cache-mem MiB]
//       [--seed S] [--preempt P] [--activation-bits 16|8] (and the other launch flags)
//   mpirun -np 2 build/bin/serving_soak --pp 2 ...   (pipelined steps; any --tp/--pp/--dp)
// Random requests over a few shared documents, multi-turn sessions, cancellations and forced
// preemption in a small KV pool. Checked throughout: block accounting is consistent, every step
// makes progress (no preemption livelock or deadlock), a prompt always yields the same greedy
// tokens (the kernels are batch invariant); at the end every request has completed exactly once
// and no block is referenced or announced for routing. Prints a summary and exits non-zero on the
// first violation.
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "coordinator/flags.h"
#include "coordinator/launch.h"
#include "kernels/ops.h"
#include "serving/serving_engine.h"
#include "util/str_cat.h"

namespace kvmesh::bench {
namespace {

using Clock = std::chrono::steady_clock;

int Violation(const std::string& what) {
  std::fprintf(stderr, "serving_soak: VIOLATION: %s\n", what.c_str());
  return 1;
}

int Soak(const coordinator::Flags* f, serving::ServingEngine& se) {
  worker::Engine& e = se.engine();
  const double seconds = static_cast<double>(f->Int("seconds", 600, 1, 1 << 30).value_or(600));
  std::mt19937_64 rng(f->Uint64("seed", 1).value_or(1));
  se.SetPreemptProbabilityForTesting(f->Float("preempt", 0.2, 0, 1).value_or(0.2));
  // Submit / Cancel / Step / idle / stats through the serving engine (it pipelines steps when
  // there are pipeline stages); block accounting from replica 0's scheduler.
  serving::ServingEngine& sched = se;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 3; ++d) {
    std::string text;
    for (int i = 0; i < 12 + 10 * d; ++i) {
      text += StrCat("Record ", d, "-", i, " says the value is ", (i * 37 + d) % 101, ". ");
    }
    docs.push_back(e.tokenizer().Encode(text, false));
  }
  std::map<std::vector<int32_t>, std::vector<int32_t>> seen;  // prompt+max -> greedy tokens
  std::map<serving::RequestId, std::vector<int32_t>> live;    // id -> key
  std::map<std::string, std::vector<int32_t>> conversations;
  int64_t submitted = 0, completed = 0, cancelled = 0, rejected = 0, checked = 0;
  int violations = 0;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  double next_report = 30;
  int64_t idle_steps = 0, last_steps = 0;
  while (elapsed() < seconds || !sched.idle()) {
    if (elapsed() < seconds && rng() % 3 == 0) {
      serving::Request r;
      r.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
      r.sampling.temperature = 0;
      const int kind = static_cast<int>(rng() % 4);
      if (kind == 0 && !conversations.empty()) {  // the next turn of a conversation
        auto it = std::next(conversations.begin(), static_cast<long>(rng() % conversations.size()));
        r.session_id = it->first;
        r.prompt = it->second;
      } else {
        r.prompt = docs[rng() % docs.size()];
      }
      for (int i = 0, n = 1 + static_cast<int>(rng() % 12); i < n; ++i) {
        r.prompt.push_back(static_cast<int32_t>(100 + rng() % 5000));
      }
      if (kind == 0 && r.session_id.empty()) r.session_id = StrCat("s", rng() % 6);
      if (static_cast<int64_t>(r.prompt.size()) >= 1800) {
        conversations.erase(r.session_id);
        continue;
      }
      std::vector<int32_t> key = r.prompt;
      key.push_back(-r.max_tokens);
      const std::string session = r.session_id;
      const std::vector<int32_t> prompt = r.prompt;
      auto id = sched.Submit(std::move(r),
                             {.on_done = [&, key, session, prompt](const serving::Completion& c) {
                               ++completed;
                               if (!live.erase(c.id)) {
                                 ++violations;
                                 Violation(StrCat("request ", c.id, " completed twice"));
                               }
                               if (!c.status.ok()) return;
                               auto [it, fresh] = seen.try_emplace(key, c.tokens);
                               ++checked;
                               if (!fresh && it->second != c.tokens) {
                                 ++violations;
                                 Violation("a prompt produced different tokens");
                               }
                               if (!session.empty()) {
                                 std::vector<int32_t> next = prompt;
                                 next.insert(next.end(), c.tokens.begin(), c.tokens.end());
                                 conversations[session] = next;
                               }
                             }});
      if (id.ok()) {
        ++submitted;
        live[*id] = key;
      } else {
        ++rejected;
      }
    }
    if (!live.empty() && rng() % 40 == 0) {
      if (sched.Cancel(std::next(live.begin(), static_cast<long>(rng() % live.size()))->first)) {
        ++cancelled;
      }
    }
    if (auto s = sched.Step(); !s.ok()) return Violation(StrCat("step failed: ", s.message()));
    if (violations > 0) return 1;
    for (int r = 0; r < se.replicas(); ++r) {
      if (!se.scheduler(r).blocks().Consistent())
        return Violation("block accounting is inconsistent");
    }
    const auto st = sched.stats();
    if (!sched.idle() && st.steps == last_steps) {
      if (++idle_steps > 1000) return Violation("no step ran for 1000 calls while requests wait");
    } else {
      idle_steps = 0;
    }
    last_steps = st.steps;
    if (elapsed() > next_report) {
      next_report += 30;
      std::printf(
          "%5.0f s: %lld submitted, %lld completed, %lld checked against an earlier run, "
          "%lld preemptions, KV %d/%d blocks used\n",
          elapsed(), static_cast<long long>(submitted), static_cast<long long>(completed),
          static_cast<long long>(checked), static_cast<long long>(st.preemptions), st.blocks_used,
          st.blocks_total);
      std::fflush(stdout);
    }
  }
  if (!live.empty()) return Violation(StrCat(live.size(), " requests never completed"));
  sched.DropSessions();
  const auto st = sched.stats();
  if (st.blocks_used != 0) return Violation(StrCat(st.blocks_used, " blocks leaked"));
  for (int r = 0; r < se.replicas(); ++r) {  // routing's names of waiting and running prompts
    if (const size_t n = se.scheduler(r).announced_blocks(); n != 0)
      return Violation(StrCat(n, " block names still announced"));
  }
  std::printf(
      "serving_soak: %.0f s, %lld requests (%lld cancelled, %lld rejected at submit), "
      "%lld outputs re-checked, %lld steps, %lld preemptions, %lld evictions, "
      "prefix hits %lld/%lld tokens, %lld attention units in lanes; no leak, no stall, no "
      "divergence\n",
      elapsed(), static_cast<long long>(submitted), static_cast<long long>(cancelled),
      static_cast<long long>(rejected), static_cast<long long>(checked),
      static_cast<long long>(st.steps), static_cast<long long>(st.preemptions),
      static_cast<long long>(st.evictions), static_cast<long long>(st.prefix_hit_tokens),
      static_cast<long long>(st.prefix_query_tokens),
      static_cast<long long>(kernels::PagedAttentionLaneUnits()));
  return 0;
}

int Main(int argc, char** argv) {
  std::set<std::string> names = coordinator::LaunchFlagNames();
  names.insert({"model", "seconds", "seed", "preempt"});
  auto f = coordinator::Flags::Parse(argc, argv, 1, names, {});
  if (!f.ok()) return coordinator::Fail(f.status());
  if (f->help()) {
    std::fputs(
        "usage: serving_soak [--seconds 600] [--model PATH] [--threads N] [--kv-cache-mem MiB]\n"
        "    [--seed S] [--preempt P] [--activation-bits 16|8] [other launch flags]\n"
        "Random requests, sessions, cancellations and forced preemption on a small KV pool;\n"
        "exits non-zero on the first violation (bench/serving_soak.cc).\n",
        stdout);
    return 0;
  }
  // A small pool and batch, so preemption and eviction are constant.
  f->AddDefaults({{"ctx-size", "2048"},
                  {"kv-cache-mem", "12"},
                  {"max-seqs", "8"},
                  {"max-batched-tokens", "96"},
                  {"max-waiting", "64"},
                  {"max-sessions", "4"}});
  coordinator::Launch l;
  if (auto s = coordinator::SetUp(*f, l); !s.ok()) return coordinator::Fail(s);
  return coordinator::RunLaunched(l, [&] { return Soak(&*f, *l.serving); });
}

}  // namespace
}  // namespace kvmesh::bench

int main(int argc, char** argv) { return kvmesh::bench::Main(argc, argv); }
