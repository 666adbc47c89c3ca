#include "model/shard.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "util/str_cat.h"

namespace kvmesh::model {
namespace {

// [begin, end) of part `i` of `n` split into `parts` as evenly as possible, in units of `unit`.
std::pair<int64_t, int64_t> EvenSplit(int64_t n, int parts, int i, int64_t unit = 1) {
  const int64_t units = n / unit;
  const int64_t per = units / parts, extra = units % parts;
  const int64_t b = i * per + std::min<int64_t>(i, extra);
  const int64_t e = b + per + (i < extra ? 1 : 0);
  return {b * unit, i == parts - 1 ? n : e * unit};
}

kernels::WeightMatrix Rows(const kernels::WeightMatrix& w, int64_t r0, int64_t r1) {
  kernels::WeightMatrix s = w;
  s.data = static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes;
  s.rows = r1 - r0;
  s.packed = nullptr;  // a slice is packed (or not) by its user
  s.packed_rows = 0;
  return s;
}

// Columns [c0, c1) of every row: c0 and c1 are whole blocks, so each row's slice is one
// contiguous run of blocks; the row stride stays that of the full matrix.
kernels::WeightMatrix Cols(const kernels::WeightMatrix& w, int64_t c0, int64_t c1) {
  kernels::WeightMatrix s = w;
  s.data = static_cast<const uint8_t*>(w.data) + kernels::RowBytes(w.type, c0);
  s.cols = c1 - c0;
  s.packed = nullptr;  // a slice is packed (or not) by its user
  s.packed_rows = 0;
  return s;
}

}  // namespace

std::string TpShard::Describe() const {
  return StrCat("tp rank ", tp_rank, "/", tp_size, ": query heads [", q_head_begin, ",", q_head_end,
                "), kv heads [", kv_head_begin, ",", kv_head_end, "), ffn columns [", ff_begin, ",",
                ff_end, "), vocab rows [", vocab_begin, ",", vocab_end, ")");
}

absl::Status CheckHeadSplit(int64_t n_heads, int64_t head_dim, int64_t o_block, int tp_size) {
  for (int r = 0; r < tp_size; ++r) {
    const auto [begin, end] = EvenSplit(n_heads, tp_size, r);
    for (const int64_t at : {begin * head_dim, end * head_dim}) {
      if (at % o_block != 0) {
        return absl::InvalidArgumentError(StrCat("--tp ", tp_size, ": rank ", r, "'s query heads [",
                                                 begin, ",", end, ") cut attn_output's ", o_block,
                                                 "-element blocks at column ", at));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TpShard> MakeTpShard(const LlamaModel& m, int tp_rank, int tp_size) {
  const LlamaConfig& c = m.config();
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(StrCat("tp rank ", tp_rank, " is outside tp size ", tp_size));
  }
  if (tp_size > c.n_heads) {
    return absl::InvalidArgumentError(
        StrCat("--tp ", tp_size, " is larger than the model's ", c.n_heads, " query heads"));
  }
  // Column slices must not cut a quantisation block of O or down.
  // Layers may mix types: cut at the largest block any layer's O / down uses.
  int64_t down_block = 1, o_block = 1;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    down_block = std::max(down_block, kernels::TraitsOf(m.layer(l).w_down.type).block_elems);
    o_block = std::max(o_block, kernels::TraitsOf(m.layer(l).wo.type).block_elems);
  }
  if (c.n_ff / down_block < tp_size) {
    return absl::InvalidArgumentError(StrCat("--tp ", tp_size, ": the MLP width ", c.n_ff,
                                             " has fewer than ", tp_size, " blocks of ",
                                             down_block));
  }
  if (auto st = CheckHeadSplit(c.n_heads, c.head_dim, o_block, tp_size); !st.ok()) return st;
  TpShard s;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.group = c.n_heads / c.n_kv_heads;
  std::tie(s.q_head_begin, s.q_head_end) = EvenSplit(c.n_heads, tp_size, tp_rank);
  s.kv_head_begin = s.q_head_begin / s.group;
  s.kv_head_end = (s.q_head_end - 1) / s.group + 1;
  // MLP columns split evenly. Not rebalanced against uneven head splits: each all-reduce
  // synchronises the ranks after its own half-layer, so moving MLP work to the rank with fewer
  // heads only moves the waiting from the attention all-reduce to the MLP one (measured:
  // 736 + 800 columns at tp = 2 made the leader wait 180 us per decode step, 768 + 768 ~50 us).
  std::tie(s.ff_begin, s.ff_end) = EvenSplit(c.n_ff, tp_size, tp_rank, down_block);
  std::tie(s.vocab_begin, s.vocab_end) = EvenSplit(c.n_vocab, tp_size, tp_rank);
  return s;
}

absl::StatusOr<PipelineStage> MakePipelineStage(const LlamaConfig& c, int stage, int n_stages) {
  if (n_stages < 1 || stage < 0 || stage >= n_stages) {
    return absl::InvalidArgumentError(
        StrCat("pipeline stage ", stage, " is outside pp ", n_stages));
  }
  if (n_stages > c.n_layers) {
    return absl::InvalidArgumentError(
        StrCat("--pp ", n_stages, " is larger than the model's ", c.n_layers, " layers"));
  }
  PipelineStage p;
  p.stage = stage;
  p.n_stages = n_stages;
  // Balance the matrix work: a layer costs its weights' multiply-adds per token, and the last
  // stage also runs the LM head, counted at half its cost: it runs for every decoded token but
  // only once per prompt chunk, and the first stage also samples. For SmolLM2-135M (head = 8
  // layers) 30 layers split 17 + 13: measured against 15 + 15 and 19 + 11 (docs/parallelism.md)
  // it decodes 4 sequences 9% / 6% faster and prefills a 512-token prompt 4% slower / 9% faster.
  const double hd = static_cast<double>(c.head_dim), e = static_cast<double>(c.n_embd);
  const double layer = e * hd * (2.0 * c.n_heads + 2.0 * c.n_kv_heads) + 3.0 * e * c.n_ff;
  const double head = 0.5 * e * static_cast<double>(c.n_vocab);
  // Stage boundary k (1..n-1): the layer index nearest k/n of the total work, keeping at least
  // one layer per stage. A config without sizes (tests) splits evenly.
  const double per_stage = (layer * c.n_layers + head) / n_stages;
  auto boundary = [&](int k) -> int64_t {
    if (k == 0) return 0;
    if (k == n_stages) return c.n_layers;
    const int64_t even = c.n_layers * k / n_stages;
    const int64_t want = layer > 0 ? std::llround(k * per_stage / layer) : even;
    return std::clamp<int64_t>(want, k, c.n_layers - (n_stages - k));
  };
  p.layer_begin = boundary(stage);
  p.layer_end = boundary(stage + 1);
  return p;
}

LlamaLayer SliceLayer(const LlamaLayer& f, const LlamaConfig& c, const TpShard& s) {
  const int64_t hd = c.head_dim;
  LlamaLayer l = f;
  l.wq = Rows(f.wq, s.q_head_begin * hd, s.q_head_end * hd);
  l.wk = Rows(f.wk, s.kv_head_begin * hd, s.kv_head_end * hd);
  l.wv = Rows(f.wv, s.kv_head_begin * hd, s.kv_head_end * hd);
  l.wo = Cols(f.wo, s.q_head_begin * hd, s.q_head_end * hd);
  l.w_gate = Rows(f.w_gate, s.ff_begin, s.ff_end);
  l.w_up = Rows(f.w_up, s.ff_begin, s.ff_end);
  l.w_down = Cols(f.w_down, s.ff_begin, s.ff_end);
  return l;
}

kernels::WeightMatrix SliceOutput(const kernels::WeightMatrix& out, const TpShard& s) {
  return Rows(out, s.vocab_begin, s.vocab_end);
}

}  // namespace kvmesh::model
