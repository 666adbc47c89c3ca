// How one tensor-parallel rank's share of a Llama model is cut (Megatron style).
//
// Query heads are split as evenly as possible (9 heads over 2 ranks: 5 + 4); a rank holds the
// KV heads its query heads use, so a KV head whose group straddles two ranks is held by both
// (and with tp > n_kv_heads, KV heads are replicated). Q/K/V and gate/up are split by rows
// (output features), O and down by columns (input features), so each layer needs two
// all-reduces. The LM head is split by vocabulary rows and gathered; the token embedding is
// replicated (one row per token is read, so splitting it would save memory but cost a
// collective per step).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/llama_model.h"

namespace kvmesh::model {

struct TpShard {
  int tp_rank = 0, tp_size = 1;
  int64_t q_head_begin = 0, q_head_end = 0;    // global query heads [begin, end)
  int64_t kv_head_begin = 0, kv_head_end = 0;  // global KV heads this rank holds
  int64_t ff_begin = 0, ff_end = 0;            // columns of the MLP hidden layer
  int64_t vocab_begin = 0, vocab_end = 0;      // rows of the LM head
  int64_t group = 1;                           // query heads per KV head (global)
  std::string Describe() const;                // one line, for --print-plan
};

// A pipeline stage: a contiguous range of layers, split so that every stage has about the same
// matrix work per token (the last stage's LM head counts as layers, at half weight). The first
// stage embeds the tokens; the last applies the final norm and the LM head.
struct PipelineStage {
  int stage = 0, n_stages = 1;
  int64_t layer_begin = 0, layer_end = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == n_stages - 1; }
};
absl::StatusOr<PipelineStage> MakePipelineStage(const LlamaConfig& c, int stage, int n_stages);

// InvalidArgument if the model cannot be split this way (tp larger than the query-head count,
// or column slices of O / down that would cut a quantisation block). The checks are of the
// layout, not of one rank's share: every rank of a group gets the same answer.
absl::StatusOr<TpShard> MakeTpShard(const LlamaModel& m, int tp_rank, int tp_size);
// InvalidArgument if any rank's query-head boundary, in columns of O (head_dim per head), is
// not a multiple of O's quantisation block.
absl::Status CheckHeadSplit(int64_t n_heads, int64_t head_dim, int64_t o_block, int tp_size);

// The rank's views of layer l's weights: the same LlamaLayer shape, rows or columns sliced.
LlamaLayer SliceLayer(const LlamaLayer& full, const LlamaConfig& c, const TpShard& s);
// The rank's rows of the LM head.
kernels::WeightMatrix SliceOutput(const kernels::WeightMatrix& out, const TpShard& s);

}  // namespace kvmesh::model
