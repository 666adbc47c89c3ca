#include "server/rpc_frame.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "server/rpc_sampling.h"

namespace kvmesh::server {
namespace {

kvmesh::v1::Frame Example(uint64_t id) {
  kvmesh::v1::Frame f;
  f.set_request_id(id);
  auto* g = f.mutable_generate();
  g->set_prompt("The capital of France is");
  g->set_max_tokens(8);
  g->mutable_sampling()->set_temperature(0.5f);
  return f;
}

TEST(RpcFrame, RoundTripsByteByByteAndBackToBack) {
  const std::string bytes = EncodeFrame(Example(1)) + EncodeFrame(Example(2));
  FrameDecoder d;
  std::vector<uint64_t> ids;
  for (char c : bytes) {  // one byte at a time: every prefix is "need more", never an error
    d.Feed(&c, 1);
    for (;;) {
      auto f = d.Next();
      ASSERT_TRUE(f.ok()) << f.status();
      if (!f->has_value()) break;
      EXPECT_EQ((*f)->generate().prompt(), "The capital of France is");
      ids.push_back((*f)->request_id());
    }
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(RpcFrame, RejectsOversizedLengthsAndGarbage) {
  FrameDecoder d(1024);
  const char huge[4] = {'\xff', '\xff', '\xff', '\x7f'};
  d.Feed(huge, 4);
  auto f = d.Next();
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("exceeds the limit of 1024 bytes"), std::string::npos);
  FrameDecoder g;
  const char junk[] = {5, 0, 0, 0, '\xff', '\xff', '\xff', '\xff', '\xff'};
  g.Feed(junk, sizeof(junk));
  auto h = g.Next();
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("not a kvmesh.v1.Frame"), std::string::npos);
}

TEST(RpcFrame, RandomCorruptionNeverCrashes) {
  const std::string good = EncodeFrame(Example(7));
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::string b = good;
    b[rng() % b.size()] = static_cast<char>(rng());
    FrameDecoder d(1 << 16);
    d.Feed(b.data(), b.size());
    for (int k = 0; k < 4; ++k) {
      auto f = d.Next();
      if (!f.ok() || !f->has_value()) break;
    }
  }
}

// Sampling over RPC: zeros mean "off", out-of-range values and NaN are errors naming the field,
// and an unset seed is a fresh one per request.
TEST(RpcSampling, ChecksRangesAndDrawsAMissingSeed) {
  kvmesh::v1::SamplingParams p;
  auto a = SamplingFromProto(p), b = SamplingFromProto(p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->top_p, 1.0f);
  EXPECT_EQ(a->repeat_penalty, 1.0f);
  EXPECT_NE(a->seed, b->seed) << "no seed: a fresh draw each time";
  p.set_seed(0);
  EXPECT_EQ(SamplingFromProto(p)->seed, 0u) << "a given seed, even 0, is kept";
  const std::pair<void (*)(kvmesh::v1::SamplingParams&), const char*> bad[] = {
      {[](kvmesh::v1::SamplingParams& q) { q.set_top_p(-1); }, "top_p"},
      {[](kvmesh::v1::SamplingParams& q) { q.set_top_p(NAN); }, "top_p"},
      {[](kvmesh::v1::SamplingParams& q) { q.set_repeat_penalty(NAN); }, "repeat_penalty"},
      {[](kvmesh::v1::SamplingParams& q) { q.set_repeat_penalty(-1); }, "repeat_penalty"},
      {[](kvmesh::v1::SamplingParams& q) { q.set_temperature(-0.5f); }, "temperature"},
      {[](kvmesh::v1::SamplingParams& q) { q.set_temperature(INFINITY); }, "temperature"},
  };
  for (const auto& [edit, field] : bad) {
    kvmesh::v1::SamplingParams q;
    edit(q);
    auto s = SamplingFromProto(q);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(field), std::string::npos) << s.status();
  }
}

}  // namespace
}  // namespace kvmesh::server
