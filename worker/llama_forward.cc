#include "worker/llama_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/packed.h"
#include "util/str_cat.h"

namespace kvmesh::worker {

using kernels::MatMulArgs;

LlamaForward::LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
                           int64_t max_batch)
    : LlamaForward(model, pool, *model::MakeTpShard(model, 0, 1), nullptr, max_batch) {}

namespace {
constexpr int kTagHidden = 101;  // hidden states between pipeline stages
constexpr int kTagLogits = 102;  // last-position logits to the leader
PipelinePlace WholeModel(const model::LlamaModel& m) {
  PipelinePlace p;
  p.stage = *model::MakePipelineStage(m.config(), 0, 1);
  return p;
}
}  // namespace

LlamaForward::LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
                           const model::TpShard& shard, comm::Communicator* comm, int64_t max_batch)
    : LlamaForward(model, pool, shard, comm, WholeModel(model), max_batch) {}

LlamaForward::LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
                           const model::TpShard& shard, comm::Communicator* comm,
                           const PipelinePlace& place, int64_t max_batch, kernels::ActBits act_bits,
                           bool repack)
    : model_(model),
      pool_(pool),
      max_batch_(std::max<int64_t>(1, max_batch)),
      shard_(shard),
      comm_(comm),
      place_(place) {
  const auto& c = model.config();
  // Where the ISA has a packed kernel, the integer-path matrices are repacked in 16-row groups
  // (kernels/packed.h): a rank-owned contiguous copy, read from the mapped file once. Otherwise
  // the column slices (O, down) of a TP shard are copied into contiguous rank-owned rows: read
  // in place they would share pages and prefetch streams with the peers' columns.
  const bool pack = repack && kernels::PackedKernelIsFast();
  for (int64_t l = place.stage.layer_begin; l < place.stage.layer_end; ++l) {
    model::LlamaLayer& L = layers_.emplace_back(model::SliceLayer(model.layer(l), c, shard));
    if (!pack && shard.tp_size > 1) {
      for (kernels::WeightMatrix* w : {&L.wo, &L.w_down}) *w = Materialise(*w);
    }
  }
  output_ = model::SliceOutput(model.output(), shard);
  if (pack) {
    // Every packed matrix in one region on huge pages (util/huge_pages.h), each at a line.
    std::vector<kernels::WeightMatrix*> mats;
    for (model::LlamaLayer& L : layers_) {
      for (kernels::WeightMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        mats.push_back(w);
    }
    if (place.stage.last()) mats.push_back(&output_);
    auto aligned = [](int64_t b) { return (b + 63) / 64 * 64; };
    int64_t bytes = 0;
    for (const kernels::WeightMatrix* w : mats) bytes += aligned(kernels::PackedBytes(*w));
    packed_ = util::HugePageRegion::Map(static_cast<size_t>(bytes));
    packed_bytes_ = bytes;
    int64_t at = 0;
    for (kernels::WeightMatrix* w : mats) {
      const int64_t b = kernels::PackedBytes(*w);
      if (b == 0) continue;
      // (Should the region not map, each matrix gets a vector of its own.)
      uint8_t* dst = packed_.data() != nullptr ? packed_.data() + at
                                               : owned_.emplace_back(static_cast<size_t>(b)).data();
      *w = kernels::PackWeights(*w, dst, &pool, act_bits);
      at += aligned(b);
      eight_bit_ |= w->packed_a8;
      // Fully packed: its plain pages are not read again (they would refault if they were).
      // A tied output matrix is the token embedding, whose rows the lookup reads: keep those.
      if (w->packed_rows == w->rows &&
          (w != &output_ || model.output().data != model.tok_embd().data)) {
        model.gguf().DropPages(w->data, static_cast<size_t>(w->rows) * w->row_bytes);
      }
    }
  }
  if (shard.tp_size > 1) {
    // The full O and down matrices were read once to copy the slices; let their pages go.
    for (int64_t l = place.stage.layer_begin; l < place.stage.layer_end; ++l) {
      for (const kernels::WeightMatrix* w : {&model.layer(l).wo, &model.layer(l).w_down}) {
        model.gguf().DropPages(w->data, static_cast<size_t>(w->rows) * w->row_bytes);
      }
    }
  }
  for (int r = 0; r < shard.tp_size; ++r) {
    const auto s = model::MakeTpShard(model, r, shard.tp_size);
    vocab_counts_.push_back(static_cast<int>(s->vocab_end - s->vocab_begin));
  }
}

kernels::WeightMatrix LlamaForward::Materialise(const kernels::WeightMatrix& w) {
  const size_t run = static_cast<size_t>(kernels::RowBytes(w.type, w.cols));
  std::vector<uint8_t>& buf = owned_.emplace_back(run * static_cast<size_t>(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(buf.data() + r * run, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, run);
  }
  kernels::WeightMatrix out = w;
  out.data = buf.data();
  out.row_bytes = run;
  return out;
}

absl::Status LlamaForward::Forward(const StepPlan& plan, kvstore::KvBlockArena& arena,
                                   std::span<float> logits,
                                   std::unique_ptr<comm::PendingRecv>* logits_pending) {
  const auto& c = model_.config();
  PhaseClock clock(time_phases_ ? &phase_times_ : nullptr);
  const kvstore::KvBlockShape& shape = arena.shape();
  if (shape.n_layers != n_layers() || shape.n_kv_heads != n_kv_heads() ||
      shape.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("forward: KV arena shape does not match this rank's shard");
  }
  if (plan.seqs.empty()) return absl::InvalidArgumentError("forward: no tokens");
  if (auto s = ValidateStepPlan(plan, arena.n_blocks(), static_cast<int32_t>(shape.block_size),
                                static_cast<int32_t>(c.n_vocab));
      !s.ok()) {
    return s;
  }
  const int64_t n_out = plan.n_logits();
  if (static_cast<int64_t>(logits.size()) != n_out * c.n_vocab) {
    return absl::InvalidArgumentError(StrCat("forward: logits buffer holds ", logits.size(),
                                             " floats, not ", n_out, " rows of ", c.n_vocab));
  }
  const int64_t total = static_cast<int64_t>(plan.tokens.size());
  chunk_of_row_.resize(total);
  out_of_row_.assign(total, -1);
  chunk_row0_.resize(plan.seqs.size());
  for (int64_t i = 0, row = 0, out = 0; i < static_cast<int64_t>(plan.seqs.size()); ++i) {
    chunk_row0_[i] = row;
    for (int32_t t = 0; t < plan.seqs[i].n_tokens; ++t)
      chunk_of_row_[row++] = static_cast<int32_t>(i);
    if (plan.seqs[i].want_logits) out_of_row_[row - 1] = static_cast<int32_t>(out++);
  }
  hidden_out_.resize(n_out * c.n_embd);
  // With pipeline stages, cut the batch into about 4 micro-batches per stage (at least 32
  // rows each): while stage s+1 works on micro-batch i, stage s already runs i+1. Every rank
  // sees the same plan, so every rank cuts the same way.
  int64_t mb = max_batch_;
  if (place_.stage.n_stages > 1) {
    mb = std::min(mb, std::max<int64_t>(32, (total + 4 * place_.stage.n_stages - 1) /
                                                (4 * place_.stage.n_stages)));
  }
  for (int64_t b = 0; b < total; b += mb) {
    const int64_t n = std::min<int64_t>(mb, total - b);
    if (auto s = Batch(plan, b, n, arena, clock); !s.ok()) return s;
  }
  clock.Mark(Phase::kOther);
  if (n_out > 0 && place_.stage.last()) {
    kernels::RmsNormCpu(
        {hidden_out_.data(), model_.output_norm(), hidden_out_.data(), n_out, c.n_embd, c.rms_eps});
    if (comm_ == nullptr || shard_.tp_size == 1) {
      kernels::MatMulCpu(
          MatMulArgs{output_, hidden_out_.data(), logits.data(), n_out, output_.rows}, pool_);
    } else {
      // Each rank computes its vocabulary rows for every output: [n_out, v_r], followed by its
      // arrival stamp (2 floats, see Stamp). Gathered rank-major on TP rank 0, then
      // interleaved into [n_out, n_vocab].
      const int64_t mine = n_out * output_.rows;
      local_logits_.resize(mine + 2);
      kernels::MatMulCpu(
          MatMulArgs{output_, hidden_out_.data(), local_logits_.data(), n_out, output_.rows},
          pool_);
      std::vector<int> counts(vocab_counts_.size());
      for (size_t r = 0; r < counts.size(); ++r)
        counts[r] = static_cast<int>(n_out) * vocab_counts_[r] + 2;
      gathered_.resize(shard_.tp_rank == 0 ? n_out * c.n_vocab + 2 * counts.size() : 0);
      const auto t0 = std::chrono::steady_clock::now();
      Stamp(t0, local_logits_.data() + mine);
      const absl::Status s = comm_->GatherV(local_logits_, gathered_, counts, 0);
      const double in_call = Since(t0);
      comm_stats_.gather_s += in_call;
      ++comm_stats_.gathers;
      if (!s.ok()) return s;
      if (shard_.tp_rank == 0) {
        int64_t off = 0, vbegin = 0, last = 0;
        for (int v : vocab_counts_) {
          for (int64_t i = 0; i < n_out; ++i) {
            std::memcpy(logits.data() + i * c.n_vocab + vbegin, gathered_.data() + off + i * v,
                        sizeof(float) * v);
          }
          last = std::max(last, Unstamp(t0, gathered_.data() + off + n_out * v));
          off += n_out * v + 2;
          vbegin += v;
        }
        comm_stats_.gather_wait_s += Waited(t0, last, in_call);
      }
    }
    if (place_.logits_to >= 0 && shard_.tp_rank == 0) {
      if (auto s = place_.world->Send(logits, place_.logits_to, kTagLogits); !s.ok()) return s;
    }
  }
  clock.Mark(Phase::kLmHead);
  if (time_phases_) ++phase_times_.forwards;
  if (n_out > 0 && place_.logits_from >= 0) {
    if (logits_pending != nullptr) {
      auto r = place_.world->RecvAsync(logits, place_.logits_from, kTagLogits);
      if (!r.ok()) return r.status();
      *logits_pending = std::move(*r);
      return absl::OkStatus();
    }
    if (auto s = place_.world->Recv(logits, place_.logits_from, kTagLogits); !s.ok()) return s;
    clock.Mark(Phase::kOther);
  }
  return absl::OkStatus();
}

double LlamaForward::Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Arrival stamps: each rank sends the time it entered a collective (steady clock, shared by the
// processes of one machine) as two 24-bit integers in floats, which sums with zeros and copies
// keep exact. The latest stamp is when the last rank arrived: time in the call before it is
// waiting for a slower rank, time after it is the transfer itself.
void LlamaForward::Stamp(std::chrono::steady_clock::time_point t, float* out) {
  const int64_t ns = t.time_since_epoch().count();
  out[0] = static_cast<float>((ns >> 24) & 0xFFFFFF);
  out[1] = static_cast<float>(ns & 0xFFFFFF);
}

int64_t LlamaForward::Unstamp(std::chrono::steady_clock::time_point near, const float* in) {
  const int64_t top = near.time_since_epoch().count() & ~((int64_t{1} << 48) - 1);
  return top | static_cast<int64_t>(in[0]) << 24 | static_cast<int64_t>(in[1]);
}

double LlamaForward::Waited(std::chrono::steady_clock::time_point enter, int64_t last,
                            double in_call) {
  const double w = static_cast<double>(last - enter.time_since_epoch().count()) * 1e-9;
  return std::clamp(w, 0.0, in_call);
}

// The all-reduce carries every rank's arrival stamp in its own two slots after the n values.
absl::Status LlamaForward::AllReduce(int64_t n) {
  const int tp = shard_.tp_size;
  float* stamps = tmp_.data() + n;
  std::fill(stamps, stamps + 2 * tp, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  Stamp(t0, stamps + 2 * shard_.tp_rank);
  const absl::Status s = comm_->AllReduceSum({tmp_.data(), static_cast<size_t>(n + 2 * tp)});
  const double in_call = Since(t0);
  comm_stats_.allreduce_s += in_call;
  ++comm_stats_.allreduces;
  int64_t last = 0;
  for (int r = 0; r < tp; ++r) last = std::max(last, Unstamp(t0, stamps + 2 * r));
  comm_stats_.allreduce_wait_s += Waited(t0, last, in_call);
  return s;
}

absl::Status LlamaForward::Batch(const StepPlan& plan, int64_t b, int64_t n,
                                 kvstore::KvBlockArena& arena, PhaseClock& clock) {
  const auto& c = model_.config();
  const int64_t E = c.n_embd, hd = c.head_dim;
  const int64_t H = shard_.q_head_end - shard_.q_head_begin;  // this rank's heads and MLP width
  const int64_t KV = n_kv_heads(), F = shard_.ff_end - shard_.ff_begin;
  const bool reduce = comm_ != nullptr && shard_.tp_size > 1;
  const int32_t* tokens = plan.tokens.data() + b;
  const int64_t bs = arena.shape().block_size, ps = arena.shape().pos_stride();
  x_.resize(n * E);
  xn_.resize(n * E);
  q_.resize(n * H * hd);
  k_.resize(n * KV * hd);
  v_.resize(n * KV * hd);
  attn_.resize(n * H * hd);
  tmp_.resize(n * E + 2 * shard_.tp_size);  // + the all-reduce's arrival stamps
  gate_.resize(n * F);
  up_.resize(n * F);
  pos_.resize(n);
  // Each row's position, and each chunk's rows inside this micro-batch as one attention
  // sequence (a chunk may straddle micro-batches: its earlier rows' K/V are already written).
  segs_.clear();
  for (int64_t t = 0; t < n; ++t) {
    const int32_t ci = chunk_of_row_[b + t];
    const SeqChunk& ch = plan.seqs[ci];
    pos_[t] = static_cast<int32_t>(ch.pos0 + (b + t - chunk_row0_[ci]));
    if (t == 0 || chunk_of_row_[b + t - 1] != ci) {
      segs_.push_back({t, 0, pos_[t], ch.blocks.data()});
    }
    ++segs_.back().tokens;
  }
  // Where row t's K/V go in the arena (relative to a layer's K or V base).
  kv_at_.resize(n);
  k_at_.resize(n);
  k16_.resize(KV * hd);
  for (int64_t t = 0; t < n; ++t) {
    const SeqChunk& ch = plan.seqs[chunk_of_row_[b + t]];
    kv_at_[t] = ch.blocks[pos_[t] / bs] * arena.block_stride() + (pos_[t] % bs) * ps;
    k_at_[t] = ch.blocks[pos_[t] / bs] * arena.block_stride() + pos_[t] % bs;
  }

  if (!place_.stage.first()) {
    if (auto s =
            place_.world->Recv({x_.data(), static_cast<size_t>(n * E)}, place_.prev, kTagHidden);
        !s.ok()) {
      return s;
    }
  }
  const auto& emb = model_.tok_embd();
  for (int64_t t = 0; t < n && place_.stage.first(); ++t) {
    kernels::DequantizeRow(emb.type,
                           static_cast<const uint8_t*>(emb.data) + tokens[t] * emb.row_bytes,
                           x_.data() + t * E, E);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Attention's work plan (its arguments but the layer's q, K, V and output): the same for
  // every layer.
  kernels::PagedAttentionArgs attn{.n_heads = H,
                                   .n_kv_heads = KV,
                                   .head_dim = hd,
                                   .pos_stride = ps,
                                   .block_size = bs,
                                   .block_stride = arena.block_stride(),
                                   .seqs = segs_.data(),
                                   .n_seqs = static_cast<int64_t>(segs_.size()),
                                   .scale = scale,
                                   .group = shard_.group,
                                   .q_head0 = shard_.q_head_begin,
                                   .kv_head0 = shard_.kv_head_begin,
                                   .bf16 = bf16_attention_};
  kernels::PlanPagedAttention(attn, pool_.size(), attn_plan_);
  // The rotary cos/sin of every row: the same for every layer.
  rope_cs_.resize(n * c.rot_dim);
  kernels::RopeTableCpu(pos_.data(), n, c.rot_dim, c.rope_theta, rope_cs_.data());
  k16_.resize(n * KV * hd);
  // The element-wise steps between products run row-parallel inside the next product's
  // quantisation pass (kernels::PrepareRows): the residual add of the sub-layer before (held in
  // tmp_ until then), the norm, the SwiGLU.
  bool add_pending = false;
  auto add_and_norm = [&](const float* norm_w) {
    return [&, norm_w](int64_t t0, int64_t t1) {
      if (add_pending)
        kernels::AddInPlaceCpu(x_.data() + t0 * E, tmp_.data() + t0 * E, (t1 - t0) * E);
      kernels::RmsNormCpu({x_.data() + t0 * E, norm_w, xn_.data() + t0 * E, t1 - t0, E, c.rms_eps});
    };
  };
  for (int64_t l = 0; l < n_layers(); ++l) {  // l indexes this rank's layers and cache
    const model::LlamaLayer& L = layers_[l];
    const MatMulArgs qkv[] = {{L.wq, xn_.data(), q_.data(), n, H * hd},
                              {L.wk, xn_.data(), k_.data(), n, KV * hd},
                              {L.wv, xn_.data(), v_.data(), n, KV * hd}};
    clock.Mark(Phase::kOther);  // the batch's set-up; from the second layer on, nothing
    kernels::MatMulManyCpu(qkv, pool_, add_and_norm(L.attn_norm));
    clock.Mark(Phase::kQkv);
    add_pending = false;
    uint16_t* kl = arena.k(l);
    uint16_t* vl = arena.v(l);
    // Rotate Q and K, and write each row's K/V ([KV, hd], one block slot) before attention
    // reads it.
    pool_.ParallelFor(n, 1, [&](int64_t t0, int64_t t1) {
      kernels::RopeApplyCpu(q_.data() + t0 * H * hd, t1 - t0, H, hd, c.rot_dim,
                            rope_cs_.data() + t0 * c.rot_dim);
      kernels::RopeApplyCpu(k_.data() + t0 * KV * hd, t1 - t0, KV, hd, c.rot_dim,
                            rope_cs_.data() + t0 * c.rot_dim);
      for (int64_t t = t0; t < t1; ++t) {
        if (bf16_attention_) {  // bf16 pairs (kernels/ops.h PagedAttentionArgs::bf16)
          const int64_t slot = pos_[t] % bs;
          uint16_t* kb = k16_.data() + t * KV * hd;
          kernels::ConvertToBf16Cpu(k_.data() + t * KV * hd, kb, KV * hd);
          uint16_t* kd = kl + (k_at_[t] - slot) + 2 * slot;
          for (int64_t e = 0; e < KV * hd; e += 2) {
            kd[e * bs] = kb[e];
            kd[e * bs + 1] = kb[e + 1];
          }
          kernels::ConvertToBf16Cpu(v_.data() + t * KV * hd, kb, KV * hd);
          uint16_t* vd = vl + (kv_at_[t] - slot * ps) + (slot & ~int64_t{1}) * ps + (slot & 1);
          for (int64_t e = 0; e < KV * hd; ++e) vd[2 * e] = kb[e];
          continue;
        }
        // K is transposed within its block (kvstore/block_arena.h): element e every bs slots.
        uint16_t* k16 = k16_.data() + t * KV * hd;
        kernels::ConvertToFp16Cpu(k_.data() + t * KV * hd, k16, KV * hd);
        for (int64_t e = 0; e < KV * hd; ++e) kl[k_at_[t] + e * bs] = k16[e];
        kernels::ConvertToFp16Cpu(v_.data() + t * KV * hd, vl + kv_at_[t], KV * hd);
      }
    });
    clock.Mark(Phase::kRope);
    kernels::PagedAttentionCpu(attn_plan_, q_.data(), kl, vl, attn_.data(), pool_);
    clock.Mark(Phase::kAttention);
    kernels::MatMulCpu(MatMulArgs{L.wo, attn_.data(), tmp_.data(), n, E}, pool_);
    if (reduce) {
      if (auto s = AllReduce(n * E); !s.ok()) return s;
    }
    add_pending = true;
    clock.Mark(Phase::kOProj);
    const MatMulArgs gate_up[] = {{L.w_gate, xn_.data(), gate_.data(), n, F},
                                  {L.w_up, xn_.data(), up_.data(), n, F}};
    kernels::MatMulManyCpu(gate_up, pool_, add_and_norm(L.ffn_norm));
    clock.Mark(Phase::kGateUp);
    // Row by row, so that each row's bits do not depend on the batch.
    kernels::MatMulCpu(
        MatMulArgs{L.w_down, gate_.data(), tmp_.data(), n, E}, pool_, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            kernels::SwiGluCpu(gate_.data() + t * F, up_.data() + t * F, gate_.data() + t * F, F);
          }
        });
    if (reduce) {
      if (auto s = AllReduce(n * E); !s.ok()) return s;
    }
    add_pending = true;
    clock.Mark(Phase::kDown);
  }
  if (add_pending) kernels::AddInPlaceCpu(x_.data(), tmp_.data(), n * E);
  if (place_.stage.last()) {
    for (int64_t t = 0; t < n; ++t) {
      if (const int32_t o = out_of_row_[b + t]; o >= 0) {
        std::memcpy(hidden_out_.data() + o * E, x_.data() + t * E, sizeof(float) * E);
      }
    }
  } else {
    if (auto s =
            place_.world->Send({x_.data(), static_cast<size_t>(n * E)}, place_.next, kTagHidden);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::worker
