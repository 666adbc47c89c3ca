// Byte-level BPE tokenizer (GPT-2 family) built from a GGUF's tokenizer.ggml.* metadata.
//
// Encode: control tokens written literally in the text are recognised when parse_special is
// true; the rest is pre-tokenised (per the GGUF's tokenizer.ggml.pre: "smollm" splits every
// digit on its own, then applies the GPT-2 pattern) and each piece is merged by BPE rank.
// Decode maps ids back to bytes, so Decode(Encode(s)) == s for any UTF-8 s. Immutable after
// creation; safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"

namespace kvmesh::model {

using TokenId = int32_t;

enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  // Reads tokens, types and merges. InvalidArgument (naming the key) if they are missing,
  // inconsistent, or the tokenizer model / pre-tokeniser is not one kvmesh implements.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& f);

  std::vector<TokenId> Encode(std::string_view text, bool parse_special) const;
  // Concatenated bytes of the tokens; control tokens are included only if `special`. Ids out of
  // range decode to nothing.
  std::string Decode(const std::vector<TokenId>& ids, bool special = false) const;
  // Bytes of one token (for streaming; may be an incomplete UTF-8 sequence).
  std::string TokenBytes(TokenId id, bool special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenType type(TokenId id) const { return types_[id]; }
  // -1 when the model has no such token.
  TokenId Find(std::string_view token_text) const;
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  // True for tokens that end generation: EOS, EOT-like control tokens (<|im_end|>,
  // <|endoftext|>, <|eot_id|>, <end_of_turn>).
  bool IsEndOfGeneration(TokenId id) const;

 private:
  Tokenizer() = default;
  void SplitPieces(std::string_view text, std::vector<std::string_view>* pieces) const;
  void BpeEncodePiece(std::string_view piece, std::vector<TokenId>* out) const;

  std::vector<std::string> tokens_;  // GPT-2 byte-unicode text, as stored in the GGUF
  std::vector<TokenType> types_;
  std::unordered_map<std::string, TokenId> token_to_id_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  std::vector<TokenId> special_;                         // sorted by text length, longest first
  std::vector<TokenId> eog_;
  bool split_digits_ = false;
  TokenId bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
};

}  // namespace kvmesh::model
