// One step of the engine as the coordinator plans it and every rank executes it: block copies
// (copy-on-write of shared partial blocks), then one forward pass over a batch of sequence
// chunks (prefill chunks and single decode tokens mixed).
//
// A plan travels from the leader to the other ranks as int32 words (Encode / Decode); Decode
// validates everything it reads, so a corrupt or truncated plan is an error, never a wild
// memory access.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::worker {

// One sequence's part of a step: tokens [token0, token0 + n_tokens) of StepPlan::tokens run at
// positions [pos0, pos0 + n_tokens); positions [0, pos0 + n_tokens) live in `blocks`
// (position p in blocks[p / block_size]). want_logits: the last token's logits are returned.
struct SeqChunk {
  int32_t n_tokens = 0;
  int32_t pos0 = 0;
  bool want_logits = false;
  std::vector<int32_t> blocks;
};

struct StepPlan {
  std::vector<std::pair<int32_t, int32_t>> copies;  // (src block, dst block), run first
  std::vector<SeqChunk> seqs;
  std::vector<int32_t> tokens;  // every chunk's tokens, in seqs order

  int64_t n_logits() const;  // chunks with want_logits: rows of the logits output
  bool empty() const { return copies.empty() && seqs.empty(); }
};

std::vector<int32_t> EncodeStepPlan(const StepPlan& plan);
// InvalidArgument naming the field if the words are not a well-formed plan.
absl::StatusOr<StepPlan> DecodeStepPlan(std::span<const int32_t> words);

// Checks a plan against an arena of n_blocks blocks of block_size positions and a vocabulary:
// token counts add up, tables cover every position, ids are in range.
absl::Status ValidateStepPlan(const StepPlan& plan, int32_t n_blocks, int32_t block_size,
                              int32_t n_vocab);

}  // namespace kvmesh::worker
