// A Llama-architecture model read from a GGUF: hyper-parameters and views of the weights.
//
// The weights stay in the memory-mapped file (no copy); a LlamaModel owns the GgufFile and is
// immutable, so several engines may share one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/matmul.h"
#include "model/gguf.h"

namespace kvmesh::model {

struct LlamaConfig {
  std::string name;
  int64_t n_layers = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rot_dim = 0;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
};

struct LlamaLayer {
  const float* attn_norm = nullptr;  // [n_embd]
  const float* ffn_norm = nullptr;   // [n_embd]
  kernels::WeightMatrix wq, wk, wv,
      wo;  // [n_heads*hd, n_embd], [n_kv*hd, n_embd] x2, [n_embd, n_heads*hd]
  kernels::WeightMatrix w_gate, w_up, w_down;  // [n_ff, n_embd] x2, [n_embd, n_ff]
};

class LlamaModel {
 public:
  // Opens and validates `path`: architecture "llama", every tensor present with the expected
  // shape, norms in F32, matrices in a supported type. Errors name the tensor or key.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> FromGguf(std::unique_ptr<GgufFile> f);

  const LlamaConfig& config() const { return cfg_; }
  const GgufFile& gguf() const { return *gguf_; }
  const kernels::WeightMatrix& tok_embd() const { return tok_embd_; }  // [n_vocab, n_embd]
  const kernels::WeightMatrix& output() const { return output_; }      // tied: == tok_embd
  const float* output_norm() const { return output_norm_; }
  const LlamaLayer& layer(int64_t i) const { return layers_[i]; }

 private:
  LlamaModel() = default;
  std::unique_ptr<GgufFile> gguf_;
  LlamaConfig cfg_;
  kernels::WeightMatrix tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LlamaLayer> layers_;
};

}  // namespace kvmesh::model
