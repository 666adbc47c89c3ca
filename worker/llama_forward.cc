#include "worker/llama_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"
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
                           const PipelinePlace& place, int64_t max_batch)
    : model_(model),
      pool_(pool),
      max_batch_(std::max<int64_t>(1, max_batch)),
      shard_(shard),
      comm_(comm),
      place_(place) {
  const auto& c = model.config();
  for (int64_t l = place.stage.layer_begin; l < place.stage.layer_end; ++l) {
    layers_.push_back(model::SliceLayer(model.layer(l), c, shard));
    if (shard.tp_size > 1) {
      for (kernels::WeightMatrix* w : {&layers_.back().wo, &layers_.back().w_down}) {
        *w = Materialise(*w);
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
  output_ = model::SliceOutput(model.output(), shard);
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

absl::Status LlamaForward::Forward(std::span<const int32_t> tokens, kvstore::KvCache& cache,
                                   std::span<float> logits) {
  const auto& c = model_.config();
  if (tokens.empty()) return absl::InvalidArgumentError("forward: no tokens");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      return absl::InvalidArgumentError(StrCat("forward: token id ", tokens[i], " at index ", i,
                                               " is outside the vocabulary [0, ", c.n_vocab, ")"));
    }
  }
  if (!logits.empty() && static_cast<int64_t>(logits.size()) != c.n_vocab) {
    return absl::InvalidArgumentError("forward: logits buffer is not n_vocab long");
  }
  if (auto s = cache.Reserve(cache.size() + static_cast<int64_t>(tokens.size())); !s.ok()) return s;
  // With pipeline stages, cut a prefill into about 4 micro-batches per stage (at least 32
  // tokens each): while stage s+1 works on micro-batch i, stage s already runs i+1. Every rank
  // sees the same token count, so every rank cuts the same way.
  const int64_t total = static_cast<int64_t>(tokens.size());
  int64_t mb = max_batch_;
  if (place_.stage.n_stages > 1) {
    mb = std::min(mb, std::max<int64_t>(32, (total + 4 * place_.stage.n_stages - 1) /
                                                (4 * place_.stage.n_stages)));
  }
  for (int64_t b = 0; b < total; b += mb) {
    const int64_t n = std::min<int64_t>(mb, total - b);
    if (auto s = Batch(tokens.data() + b, n, cache); !s.ok()) return s;
  }
  if (!logits.empty() && place_.stage.last()) {
    // x_ holds the last batch's hidden states; only the final token needs the LM head.
    const int64_t last = (total - 1) % mb;
    std::vector<float> h(x_.begin() + last * c.n_embd, x_.begin() + (last + 1) * c.n_embd);
    kernels::RmsNormCpu({h.data(), model_.output_norm(), h.data(), 1, c.n_embd, c.rms_eps});
    if (comm_ == nullptr || shard_.tp_size == 1) {
      kernels::MatMulCpu(MatMulArgs{output_, h.data(), logits.data(), 1, output_.rows}, pool_);
    } else {
      local_logits_.resize(output_.rows);
      kernels::MatMulCpu(MatMulArgs{output_, h.data(), local_logits_.data(), 1, output_.rows},
                         pool_);
      const auto t0 = std::chrono::steady_clock::now();
      const absl::Status s = comm_->GatherV(local_logits_, logits, vocab_counts_, 0);
      CountComm(t0);
      if (!s.ok()) return s;
    }
    if (place_.logits_to >= 0 && shard_.tp_rank == 0) {
      if (auto s = place_.world->Send(logits, place_.logits_to, kTagLogits); !s.ok()) return s;
    }
  }
  if (!logits.empty() && place_.logits_from >= 0) {
    if (auto s = place_.world->Recv(logits, place_.logits_from, kTagLogits); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void LlamaForward::CountComm(std::chrono::steady_clock::time_point t0) {
  comm_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ++comm_calls_;
}

absl::Status LlamaForward::AllReduce(int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = comm_->AllReduceSum({tmp_.data(), static_cast<size_t>(n)});
  CountComm(t0);
  return s;
}

absl::Status LlamaForward::Batch(const int32_t* tokens, int64_t n, kvstore::KvCache& cache) {
  const auto& c = model_.config();
  const int64_t E = c.n_embd, hd = c.head_dim;
  const int64_t H = shard_.q_head_end - shard_.q_head_begin;  // this rank's heads and MLP width
  const int64_t KV = n_kv_heads(), F = shard_.ff_end - shard_.ff_begin;
  const bool reduce = comm_ != nullptr && shard_.tp_size > 1;
  const int64_t pos0 = cache.size();
  x_.resize(n * E);
  xn_.resize(n * E);
  q_.resize(n * H * hd);
  k_.resize(n * KV * hd);
  v_.resize(n * KV * hd);
  attn_.resize(n * H * hd);
  tmp_.resize(n * E);
  gate_.resize(n * F);
  up_.resize(n * F);
  pos_.resize(n);
  for (int64_t t = 0; t < n; ++t) pos_[t] = static_cast<int32_t>(pos0 + t);

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
  for (int64_t l = 0; l < n_layers(); ++l) {  // l indexes this rank's layers and cache
    const model::LlamaLayer& L = layers_[l];
    kernels::RmsNormCpu({x_.data(), L.attn_norm, xn_.data(), n, E, c.rms_eps});
    const MatMulArgs qkv[] = {{L.wq, xn_.data(), q_.data(), n, H * hd},
                              {L.wk, xn_.data(), k_.data(), n, KV * hd},
                              {L.wv, xn_.data(), v_.data(), n, KV * hd}};
    kernels::MatMulManyCpu(qkv, pool_);
    kernels::RopeCpu({q_.data(), pos_.data(), n, H, hd, c.rot_dim, c.rope_theta});
    kernels::RopeCpu({k_.data(), pos_.data(), n, KV, hd, c.rot_dim, c.rope_theta});
    // Append K/V at positions [pos0, pos0 + n): the cache rows are exactly [n, KV, hd].
    kernels::ConvertToFp16Cpu(k_.data(), cache.k(l) + pos0 * cache.pos_stride(), n * KV * hd);
    kernels::ConvertToFp16Cpu(v_.data(), cache.v(l) + pos0 * cache.pos_stride(), n * KV * hd);
    kernels::AttentionCpu(
        {q_.data(), cache.k(l), cache.v(l), attn_.data(), n, H, KV, hd, cache.pos_stride(), pos0,
         scale, shard_.group, shard_.q_head_begin, shard_.kv_head_begin},
        pool_);
    kernels::MatMulCpu(MatMulArgs{L.wo, attn_.data(), tmp_.data(), n, E}, pool_);
    if (reduce) {
      if (auto s = AllReduce(n * E); !s.ok()) return s;
    }
    kernels::AddInPlaceCpu(x_.data(), tmp_.data(), n * E);

    kernels::RmsNormCpu({x_.data(), L.ffn_norm, xn_.data(), n, E, c.rms_eps});
    const MatMulArgs gate_up[] = {{L.w_gate, xn_.data(), gate_.data(), n, F},
                                  {L.w_up, xn_.data(), up_.data(), n, F}};
    kernels::MatMulManyCpu(gate_up, pool_);
    kernels::SwiGluCpu(gate_.data(), up_.data(), gate_.data(), n * F);
    kernels::MatMulCpu(MatMulArgs{L.w_down, gate_.data(), tmp_.data(), n, E}, pool_);
    if (reduce) {
      if (auto s = AllReduce(n * E); !s.ok()) return s;
    }
    kernels::AddInPlaceCpu(x_.data(), tmp_.data(), n * E);
  }
  cache.set_size(pos0 + n);
  if (!place_.stage.last()) {
    if (auto s =
            place_.world->Send({x_.data(), static_cast<size_t>(n * E)}, place_.next, kTagHidden);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::worker
