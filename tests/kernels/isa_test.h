// Internal to the kernels tests (ops_test.cc, attention_test.cc): the fixture that runs a test
// once per ISA table (skipped where the CPU lacks it; instantiated in ops_test.cc for every
// test of the binary) and the helpers both files use.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/isa.h"

namespace kvmesh::kernels::isa_test {

// sqrt(sum (got - ref)^2 / sum ref^2).
inline double RelL2(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// n values drawn from N(0, scale^2), seeded.
inline std::vector<float> Randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Runs the test with the table of GetParam(), restoring the detected one after.
class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!SetIsa(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam());
  }
  void TearDown() override { SetIsa(DetectedIsa()); }
};

}  // namespace kvmesh::kernels::isa_test
