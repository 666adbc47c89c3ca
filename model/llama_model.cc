#include "model/llama_model.h"

#include <cmath>

#include "util/str_cat.h"

namespace kvmesh::model {
namespace {

absl::StatusOr<int64_t> PositiveKey(const GgufFile& f, const std::string& key, int64_t max) {
  auto v = f.GetUint(key);
  if (!v.ok()) return Required(v.status());
  if (*v == 0 || *v > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(StrCat("gguf: key '", key, "' = ", *v, " is out of range"));
  }
  return static_cast<int64_t>(*v);
}

absl::StatusOr<kernels::WeightMatrix> Matrix(const GgufFile& f, const std::string& name,
                                             int64_t rows, int64_t cols) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (!t) return absl::InvalidArgumentError(StrCat("model: missing tensor '", name, "'"));
  if (t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows) {
    std::string dims;
    for (auto d : t->dims) dims += StrCat(dims.empty() ? "" : ",", d);
    return absl::InvalidArgumentError(
        StrCat("model: tensor '", name, "' has shape [", dims, "], want [", cols, ",", rows, "]"));
  }
  kernels::WeightMatrix w;
  w.type = t->type;
  w.data = f.TensorData(*t);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = static_cast<size_t>(kernels::RowBytes(t->type, cols));
  return w;
}

absl::StatusOr<const float*> Vector(const GgufFile& f, const std::string& name, int64_t n) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (!t) return absl::InvalidArgumentError(StrCat("model: missing tensor '", name, "'"));
  if (t->type != kernels::DType::kF32 || t->dims.size() != 1 || t->dims[0] != n) {
    return absl::InvalidArgumentError(StrCat("model: tensor '", name, "' must be F32 [", n, "]"));
  }
  return reinterpret_cast<const float*>(f.TensorData(*t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path) {
  auto f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return FromGguf(std::move(*f));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromGguf(std::unique_ptr<GgufFile> f) {
  auto arch = f->GetString("general.architecture");
  if (!arch.ok()) return Required(arch.status());
  if (*arch != "llama") {
    return absl::InvalidArgumentError(
        StrCat("model: unsupported architecture '", *arch, "' (supported: llama)"));
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  LlamaConfig& c = m->cfg_;
  auto name = f->GetString("general.name");
  c.name = name.ok() ? std::string(*name) : "llama";
#define KV_ASSIGN(field, key, max)      \
  {                                     \
    auto v = PositiveKey(*f, key, max); \
    if (!v.ok()) return v.status();     \
    c.field = *v;                       \
  }
  KV_ASSIGN(n_layers, "llama.block_count", 1024);
  KV_ASSIGN(n_embd, "llama.embedding_length", 1 << 16);
  KV_ASSIGN(n_ff, "llama.feed_forward_length", 1 << 18);
  KV_ASSIGN(n_heads, "llama.attention.head_count", 1024);
  KV_ASSIGN(n_ctx_train, "llama.context_length", 1 << 24);
#undef KV_ASSIGN
  c.n_kv_heads = c.n_heads;
  if (f->Find("llama.attention.head_count_kv")) {
    auto v = PositiveKey(*f, "llama.attention.head_count_kv", c.n_heads);
    if (!v.ok()) return v.status();
    c.n_kv_heads = *v;
  }
  if (c.n_heads % c.n_kv_heads != 0 || c.n_embd % c.n_heads != 0) {
    return absl::InvalidArgumentError(
        "model: head counts do not divide the embedding / each other");
  }
  c.head_dim = c.n_embd / c.n_heads;
  c.rot_dim = c.head_dim;
  if (f->Find("llama.rope.dimension_count")) {
    auto v = PositiveKey(*f, "llama.rope.dimension_count", c.head_dim);
    if (!v.ok()) return v.status();
    c.rot_dim = *v;
  }
  // Finite and positive as float32 (NaN, 0 or inf would run and print garbage).
  auto positive_float = [&](const char* key, float& out) -> absl::Status {
    if (!f->Find(key)) return absl::OkStatus();
    auto v = f->GetFloat(key);
    if (!v.ok()) return v.status();
    const float x = static_cast<float>(*v);
    if (!(x > 0.0f) || !std::isfinite(x)) {
      return absl::InvalidArgumentError(
          StrCat("gguf: key '", key, "' = ", *v, " must be a finite number > 0"));
    }
    out = x;
    return absl::OkStatus();
  };
  if (auto s = positive_float("llama.rope.freq_base", c.rope_theta); !s.ok()) return s;
  if (auto s = positive_float("llama.attention.layer_norm_rms_epsilon", c.rms_eps); !s.ok()) {
    return s;
  }
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  if (!emb || emb->dims.size() != 2)
    return absl::InvalidArgumentError("model: missing or malformed tensor 'token_embd.weight'");
  c.n_vocab = emb->dims[1];

  const int64_t hd = c.head_dim;
  auto tok = Matrix(*f, "token_embd.weight", c.n_vocab, c.n_embd);
  if (!tok.ok()) return tok.status();
  m->tok_embd_ = *tok;
  if (f->FindTensor("output.weight")) {
    auto out = Matrix(*f, "output.weight", c.n_vocab, c.n_embd);
    if (!out.ok()) return out.status();
    m->output_ = *out;
  } else {
    m->output_ = m->tok_embd_;  // tied embeddings
  }
  auto on = Vector(*f, "output_norm.weight", c.n_embd);
  if (!on.ok()) return on.status();
  m->output_norm_ = *on;
  m->layers_.resize(c.n_layers);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = StrCat("blk.", i, ".");
    LlamaLayer& L = m->layers_[i];
    struct M {
      kernels::WeightMatrix* dst;
      const char* n;
      int64_t r, cc;
    };
    const M mats[] = {
        {&L.wq, "attn_q.weight", c.n_heads * hd, c.n_embd},
        {&L.wk, "attn_k.weight", c.n_kv_heads * hd, c.n_embd},
        {&L.wv, "attn_v.weight", c.n_kv_heads * hd, c.n_embd},
        {&L.wo, "attn_output.weight", c.n_embd, c.n_heads * hd},
        {&L.w_gate, "ffn_gate.weight", c.n_ff, c.n_embd},
        {&L.w_up, "ffn_up.weight", c.n_ff, c.n_embd},
        {&L.w_down, "ffn_down.weight", c.n_embd, c.n_ff},
    };
    for (const M& mm : mats) {
      auto w = Matrix(*f, p + mm.n, mm.r, mm.cc);
      if (!w.ok()) return w.status();
      *mm.dst = *w;
    }
    auto an = Vector(*f, p + "attn_norm.weight", c.n_embd);
    if (!an.ok()) return an.status();
    L.attn_norm = *an;
    auto fn = Vector(*f, p + "ffn_norm.weight", c.n_embd);
    if (!fn.ok()) return fn.status();
    L.ffn_norm = *fn;
  }
  m->gguf_ = std::move(f);
  return m;
}

}  // namespace kvmesh::model
