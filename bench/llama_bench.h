// `kvmesh bench`: llama-bench's pp/tg measurements on kvmesh's engine.
//
//   pp N  processing one N-token batch (random token ids) after `depth` tokens already cached
//   tg N  N single-token decode steps (logits computed each step, no sampling) after `depth`
//
// Each test is run once to warm up, then `reps` times; the cache is rebuilt between runs and
// the depth prefill is not timed. Reported: tokens/s median, mean and standard deviation.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::bench {

struct BenchOptions {
  std::string model_path;
  std::vector<int> n_prompt{512};
  std::vector<int> n_gen{128};
  std::vector<int> threads{1};
  std::vector<int> depth{0};
  int reps = 5;
  bool json = false;
  bool bandwidth = true;  // also measure memory bandwidth and report the decode bound
};

struct BenchResult {
  std::string test;  // "pp512", "tg128", with " @ d4096" when depth > 0
  int threads = 0, n_prompt = 0, n_gen = 0, depth = 0;
  std::vector<double> samples_ts;  // tokens/s per repetition
  double median_ts = 0, mean_ts = 0, stddev_ts = 0;
  // tg only: bytes of weights + KV read per token, and the bound they give at the measured
  // bandwidth (0 when not measured).
  double bytes_per_token = 0, bandwidth_gbps = 0, bound_ts = 0;
  double rss_mib = 0;  // resident set after the test
  // The resident-memory budget: model file + the test's KV cache + 64 MiB.
  double model_mib = 0, kv_mib = 0, rss_budget_mib = 0;
};

// Runs every combination; prints a table (or JSON lines) to stdout as results arrive.
absl::StatusOr<std::vector<BenchResult>> RunBench(const BenchOptions& opts);

}  // namespace kvmesh::bench
