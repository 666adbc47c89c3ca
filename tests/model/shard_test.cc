#include "model/shard.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "tests/util/test_paths.h"

namespace kvmesh::model {
namespace {

class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    KVMESH_REQUIRE_MODEL(path);
    auto m = LlamaModel::Load(path);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(Shards, PartitionHeadsColumnsAndVocabulary) {
  const LlamaConfig& c = model_->config();
  for (int tp = 1; tp <= 9; ++tp) {
    SCOPED_TRACE(tp);
    int64_t q = 0, ff = 0, vocab = 0;
    std::set<int64_t> kv_seen;
    for (int r = 0; r < tp; ++r) {
      auto s = MakeTpShard(*model_, r, tp);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->q_head_begin, q);
      EXPECT_EQ(s->ff_begin, ff);
      EXPECT_EQ(s->vocab_begin, vocab);
      q = s->q_head_end;
      ff = s->ff_end;
      vocab = s->vocab_end;
      // Balanced: query heads differ by at most one between ranks.
      EXPECT_LE(s->q_head_end - s->q_head_begin, (c.n_heads + tp - 1) / tp);
      EXPECT_GE(s->q_head_end - s->q_head_begin, c.n_heads / tp);
      EXPECT_EQ(s->ff_begin % 32, 0);
      // Each rank holds exactly the KV heads its query heads use.
      EXPECT_EQ(s->kv_head_begin, s->q_head_begin / s->group);
      EXPECT_EQ(s->kv_head_end, (s->q_head_end - 1) / s->group + 1);
      for (int64_t h = s->kv_head_begin; h < s->kv_head_end; ++h) kv_seen.insert(h);
    }
    EXPECT_EQ(q, c.n_heads);
    EXPECT_EQ(ff, c.n_ff);
    EXPECT_EQ(vocab, c.n_vocab);
    EXPECT_EQ(static_cast<int64_t>(kv_seen.size()), c.n_kv_heads);
  }
  // MLP columns split evenly (each half-layer is synchronised by its own all-reduce, so
  // columns cannot make up for uneven heads): 768 + 768 at tp = 2.
  EXPECT_EQ(MakeTpShard(*model_, 0, 2)->ff_end, 768);
  auto too_many = MakeTpShard(*model_, 0, 10);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(std::string(too_many.status().message()).find("larger than the model's 9 query heads"),
            std::string::npos);
}

// Every weight byte of a split matrix is read by exactly one rank: the slices' byte ranges tile
// each matrix (rows for Q/K/V/gate/up/LM head, whole-block column runs for O and down).
TEST_F(Shards, SlicesTileEveryMatrixByteRange) {
  const LlamaConfig& c = model_->config();
  for (int tp : {2, 3, 4}) {
    SCOPED_TRACE(tp);
    std::map<const void*, std::vector<uint8_t>> owners;  // per full matrix: readers per byte
    auto mark = [&](const kernels::WeightMatrix& full, const kernels::WeightMatrix& s) {
      auto& count = owners[full.data];
      count.resize(static_cast<size_t>(full.rows) * full.row_bytes);
      const size_t first =
          static_cast<const uint8_t*>(s.data) - static_cast<const uint8_t*>(full.data);
      const size_t run = static_cast<size_t>(kernels::RowBytes(s.type, s.cols));
      for (int64_t r = 0; r < s.rows; ++r) {
        for (size_t b = 0; b < run; ++b) ++count.at(first + r * s.row_bytes + b);
      }
    };
    const LlamaLayer& full = model_->layer(3);
    for (int r = 0; r < tp; ++r) {
      const TpShard s = *MakeTpShard(*model_, r, tp);
      const LlamaLayer sl = SliceLayer(full, c, s);
      mark(full.wq, sl.wq);
      mark(full.wo, sl.wo);
      mark(full.w_gate, sl.w_gate);
      mark(full.w_down, sl.w_down);
      mark(model_->output(), SliceOutput(model_->output(), s));
    }
    for (const kernels::WeightMatrix* m :
         {&full.wq, &full.wo, &full.w_gate, &full.w_down, &model_->output()}) {
      const auto& o = owners[m->data];
      ASSERT_EQ(o.size(), static_cast<size_t>(m->rows) * m->row_bytes);
      for (size_t b = 0; b < o.size(); ++b) ASSERT_EQ(o[b], 1) << "byte " << b << " of a matrix";
    }
  }
}

}  // namespace
}  // namespace kvmesh::model

namespace kvmesh::model {
namespace {

TEST(PipelineStages, SplitLayersContiguouslyAndEvenly) {
  LlamaConfig c;  // no sizes: layers split evenly
  c.n_layers = 30;
  for (int pp : {1, 2, 4, 7, 30}) {
    int64_t next = 0;
    for (int s = 0; s < pp; ++s) {
      auto st = MakePipelineStage(c, s, pp);
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(st->layer_begin, next);
      EXPECT_GE(st->layer_end - st->layer_begin, 30 / pp);
      EXPECT_LE(st->layer_end - st->layer_begin, (30 + pp - 1) / pp);
      EXPECT_EQ(st->first(), s == 0);
      EXPECT_EQ(st->last(), s == pp - 1);
      next = st->layer_end;
    }
    EXPECT_EQ(next, 30);
  }
}

// SmolLM2-135M: a layer is 3.54 M multiply-adds per token, the LM head 28.3 M (8 layers, counted
// as 4), so the last stage gets fewer layers; every stage keeps at least one.
TEST(PipelineStages, LastStageCountsTheLmHead) {
  LlamaConfig c;
  c.n_layers = 30;
  c.n_embd = 576;
  c.n_ff = 1536;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.n_vocab = 49152;
  auto layers = [&](int pp) {
    std::vector<int64_t> n;
    int64_t next = 0;
    for (int s = 0; s < pp; ++s) {
      auto st = MakePipelineStage(c, s, pp);
      EXPECT_TRUE(st.ok());
      EXPECT_EQ(st->layer_begin, next);
      next = st->layer_end;
      n.push_back(st->layer_end - st->layer_begin);
    }
    EXPECT_EQ(next, 30);
    return n;
  };
  EXPECT_EQ(layers(2), (std::vector<int64_t>{17, 13}));
  EXPECT_EQ(layers(4), (std::vector<int64_t>{9, 8, 9, 4}));
  EXPECT_EQ(layers(30), std::vector<int64_t>(30, 1));
  auto bad = MakePipelineStage(c, 0, 31);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(
      std::string(bad.status().message()).find("--pp 31 is larger than the model's 30 layers"),
      std::string::npos);
}

// The head split is checked for every rank, so all ranks of a group refuse a layout together.
// 32 heads of 64 over 9 ranks split 4,4,4,4,4,3,3,3,3: rank 0's columns [0, 256) fit 256-element
// blocks, rank 5's end at 23 x 64 = 1472 does not (rank 0 once passed its own check, then
// aborted reading rank 5's failed shard while sizing the KV blocks).
TEST(HeadSplit, IsCheckedForEveryRankOfTheLayout) {
  EXPECT_TRUE(CheckHeadSplit(32, 64, 256, 8).ok());
  EXPECT_TRUE(CheckHeadSplit(9, 64, 32, 2).ok());  // SmolLM2's Q4_1 attn_output at tp = 2
  const absl::Status s = CheckHeadSplit(32, 64, 256, 9);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--tp 9: rank 5's query heads [20,23) cut attn_output's 256-element blocks at "
            "column 1472");
}

}  // namespace
}  // namespace kvmesh::model
