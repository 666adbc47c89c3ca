#include "worker/step_plan.h"

#include "util/str_cat.h"

namespace kvmesh::worker {

int64_t StepPlan::n_logits() const {
  int64_t n = 0;
  for (const SeqChunk& s : seqs) n += s.want_logits ? 1 : 0;
  return n;
}

// Layout: [n_copies, (src, dst)..., n_seqs, (n_tokens, pos0, want_logits, n_blocks, blocks...)...,
//          n_tokens_total, tokens...]
std::vector<int32_t> EncodeStepPlan(const StepPlan& plan) {
  std::vector<int32_t> w;
  w.push_back(static_cast<int32_t>(plan.copies.size()));
  for (const auto& [src, dst] : plan.copies) {
    w.push_back(src);
    w.push_back(dst);
  }
  w.push_back(static_cast<int32_t>(plan.seqs.size()));
  for (const SeqChunk& s : plan.seqs) {
    w.push_back(s.n_tokens);
    w.push_back(s.pos0);
    w.push_back(s.want_logits ? 1 : 0);
    w.push_back(static_cast<int32_t>(s.blocks.size()));
    w.insert(w.end(), s.blocks.begin(), s.blocks.end());
  }
  w.push_back(static_cast<int32_t>(plan.tokens.size()));
  w.insert(w.end(), plan.tokens.begin(), plan.tokens.end());
  return w;
}

namespace {
class Reader {
 public:
  explicit Reader(std::span<const int32_t> w) : w_(w) {}
  absl::Status Next(const char* what, int32_t& out, int32_t min = 0) {
    if (at_ >= w_.size())
      return absl::InvalidArgumentError(StrCat("step plan: truncated at ", what));
    out = w_[at_++];
    if (out < min) return absl::InvalidArgumentError(StrCat("step plan: bad ", what, " ", out));
    return absl::OkStatus();
  }
  size_t left() const { return w_.size() - at_; }

 private:
  std::span<const int32_t> w_;
  size_t at_ = 0;
};
}  // namespace

absl::StatusOr<StepPlan> DecodeStepPlan(std::span<const int32_t> words) {
  Reader r(words);
  StepPlan plan;
  int32_t n;
  if (auto s = r.Next("copy count", n); !s.ok()) return s;
  if (static_cast<size_t>(n) > r.left() / 2)
    return absl::InvalidArgumentError("step plan: copy count");
  plan.copies.resize(n);
  for (auto& [src, dst] : plan.copies) {
    if (auto s = r.Next("copy source", src); !s.ok()) return s;
    if (auto s = r.Next("copy destination", dst); !s.ok()) return s;
  }
  if (auto s = r.Next("sequence count", n); !s.ok()) return s;
  if (static_cast<size_t>(n) > r.left() / 4) {
    return absl::InvalidArgumentError("step plan: sequence count");
  }
  plan.seqs.resize(n);
  for (SeqChunk& c : plan.seqs) {
    int32_t want, nb;
    if (auto s = r.Next("chunk tokens", c.n_tokens, 1); !s.ok()) return s;
    if (auto s = r.Next("chunk position", c.pos0); !s.ok()) return s;
    if (auto s = r.Next("logits flag", want); !s.ok()) return s;
    if (auto s = r.Next("block count", nb); !s.ok()) return s;
    if (static_cast<size_t>(nb) > r.left())
      return absl::InvalidArgumentError("step plan: block count");
    c.want_logits = want != 0;
    c.blocks.resize(nb);
    for (int32_t& b : c.blocks) {
      if (auto s = r.Next("block id", b); !s.ok()) return s;
    }
  }
  if (auto s = r.Next("token count", n); !s.ok()) return s;
  if (static_cast<size_t>(n) != r.left())
    return absl::InvalidArgumentError("step plan: token count");
  plan.tokens.resize(n);
  for (int32_t& t : plan.tokens) {
    if (auto s = r.Next("token", t); !s.ok()) return s;
  }
  return plan;
}

absl::Status ValidateStepPlan(const StepPlan& plan, int32_t n_blocks, int32_t block_size,
                              int32_t n_vocab) {
  for (const auto& [src, dst] : plan.copies) {
    if (src < 0 || src >= n_blocks || dst < 0 || dst >= n_blocks || src == dst) {
      return absl::InvalidArgumentError(
          StrCat("step plan: block copy ", src, " -> ", dst, " outside ", n_blocks, " blocks"));
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqChunk& c = plan.seqs[i];
    if (c.n_tokens <= 0 || c.pos0 < 0) {
      return absl::InvalidArgumentError(StrCat("step plan: sequence ", i, " has no tokens"));
    }
    const int64_t end = static_cast<int64_t>(c.pos0) + c.n_tokens;
    if (static_cast<int64_t>(c.blocks.size()) * block_size < end) {
      return absl::InvalidArgumentError(StrCat("step plan: sequence ", i, "'s ", c.blocks.size(),
                                               " blocks do not cover ", end, " positions"));
    }
    for (int32_t b : c.blocks) {
      if (b < 0 || b >= n_blocks) {
        return absl::InvalidArgumentError(
            StrCat("step plan: sequence ", i, " uses block ", b, " outside ", n_blocks, " blocks"));
      }
    }
    total += c.n_tokens;
  }
  if (total != static_cast<int64_t>(plan.tokens.size())) {
    return absl::InvalidArgumentError(
        StrCat("step plan: chunks hold ", total, " tokens but ", plan.tokens.size(), " were sent"));
  }
  for (size_t i = 0; i < plan.tokens.size(); ++i) {
    if (plan.tokens[i] < 0 || plan.tokens[i] >= n_vocab) {
      return absl::InvalidArgumentError(StrCat("step plan: token id ", plan.tokens[i], " at index ",
                                               i, " is outside the vocabulary [0, ", n_vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmesh::worker
