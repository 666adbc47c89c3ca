#include "model/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <queue>

#include "util/str_cat.h"

namespace kvmesh::model {
namespace {

// GPT-2's reversible map from bytes to printable code points: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
struct ByteMap {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cp = printable ? b : 256 + n++;
      cp_to_byte[cp] = static_cast<uint8_t>(b);
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      byte_to_utf8[b] = s;
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap m;
  return m;
}

// Decodes one UTF-8 code point at s[i]; invalid sequences yield one byte as U+FFFD-like
// "invalid" (returned as 0xFFFFFFFF) of length 1, so any byte string can be split.
uint32_t NextCodepoint(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  auto cont = [&](size_t k) {
    return i + k < s.size() && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80;
  };
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && cont(1)) {
    *len = 2;
    return ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu);
  }
  if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    *len = 3;
    return ((b0 & 0x0Fu) << 12) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<uint8_t>(s[i + 2]) & 0x3Fu);
  }
  if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    *len = 4;
    return ((b0 & 0x07u) << 18) | ((static_cast<uint8_t>(s[i + 1]) & 0x3Fu) << 12) |
           ((static_cast<uint8_t>(s[i + 2]) & 0x3Fu) << 6) |
           (static_cast<uint8_t>(s[i + 3]) & 0x3Fu);
  }
  *len = 1;
  return 0xFFFFFFFFu;
}

struct Cp {
  uint32_t cp;
  uint32_t offset;  // byte offset in the piece
  bool letter, number, space;
};

Cp Classify(uint32_t cp, uint32_t off) {
  Cp c{cp, off, false, false, false};
  if (cp == 0xFFFFFFFFu) return c;
  const auto cat = static_cast<UCharCategory>(u_charType(static_cast<UChar32>(cp)));
  c.letter = cat == U_UPPERCASE_LETTER || cat == U_LOWERCASE_LETTER || cat == U_TITLECASE_LETTER ||
             cat == U_MODIFIER_LETTER || cat == U_OTHER_LETTER;
  c.number = cat == U_DECIMAL_DIGIT_NUMBER || cat == U_LETTER_NUMBER || cat == U_OTHER_NUMBER;
  c.space = u_isUWhiteSpace(static_cast<UChar32>(cp));
  return c;
}

// The GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out as a scanner over classified code points [b, e). Appends piece end indices.
void Gpt2Split(const std::vector<Cp>& c, size_t b, size_t e, std::vector<size_t>* ends) {
  size_t pos = b;
  auto cp = [&](size_t i) { return i < e ? c[i].cp : 0xFFFFFFFFu; };
  while (pos < e) {
    const uint32_t ch = c[pos].cp;
    if (ch == '\'' && pos + 1 < e) {
      const uint32_t n1 = cp(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        pos += 2;
        ends->push_back(pos);
        continue;
      }
      if (pos + 2 < e) {
        const uint32_t n2 = cp(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          pos += 3;
          ends->push_back(pos);
          continue;
        }
      }
    }
    const size_t p2 = (ch == ' ') ? pos + 1 : pos;
    if (p2 < e) {
      const Cp& f = c[p2];
      if (f.letter) {
        pos = p2 + 1;
        while (pos < e && c[pos].letter) ++pos;
        ends->push_back(pos);
        continue;
      }
      if (f.number) {
        pos = p2 + 1;
        while (pos < e && c[pos].number) ++pos;
        ends->push_back(pos);
        continue;
      }
      if (!f.space && f.cp != 0xFFFFFFFFu) {
        pos = p2 + 1;
        while (pos < e && !c[pos].space && !c[pos].letter && !c[pos].number &&
               c[pos].cp != 0xFFFFFFFFu)
          ++pos;
        ends->push_back(pos);
        continue;
      }
    }
    size_t ws = 0;
    while (pos + ws < e && c[pos + ws].space) ++ws;
    if (ws > 1 && pos + ws < e) {  // \s+(?!\S): leave the last space for the next word
      pos += ws - 1;
      ends->push_back(pos);
      continue;
    }
    if (ws > 0) {
      pos += ws;
      ends->push_back(pos);
      continue;
    }
    ends->push_back(++pos);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  auto model = f.GetString("tokenizer.ggml.model");
  if (!model.ok()) return Required(model.status());
  if (*model != "gpt2") {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.model '", *model,
                                             "' is not supported (only byte-level BPE 'gpt2')"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto pre = f.GetString("tokenizer.ggml.pre");
  // Absent: the default; present with another type: an error (as "default" it would split
  // digits differently and change every token id silently).
  if (!pre.ok() && f.Find("tokenizer.ggml.pre") != nullptr) return pre.status();
  const std::string_view pre_name = pre.ok() ? *pre : "default";
  if (pre_name == "smollm") {
    t->split_digits_ = true;
  } else if (pre_name != "gpt-2" && pre_name != "gpt2" && pre_name != "default") {
    return absl::InvalidArgumentError(
        StrCat("tokenizer.ggml.pre '", pre_name, "' is not supported (smollm, gpt-2)"));
  }
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return Required(tokens.status());
  // At most 2M entries (the largest vocabularies in use hold ~256K): each costs ~150 bytes of
  // tables here against 8 in the file, so a crafted file could otherwise ask for gigabytes.
  constexpr size_t kMaxVocab = size_t{1} << 21;
  if (tokens->empty() || tokens->size() > kMaxVocab) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.tokens: vocabulary size ",
                                             tokens->size(), " is out of range [1, ", kMaxVocab,
                                             "]"));
  }
  const size_t n = tokens->size();
  t->tokens_.reserve(n);
  t->token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    t->tokens_.emplace_back((*tokens)[i]);
    t->token_to_id_.emplace(t->tokens_.back(), static_cast<TokenId>(i));
  }
  t->types_.assign(n, TokenType::kNormal);
  if (f.Find("tokenizer.ggml.token_type")) {
    auto types = f.GetIntArray("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    if (types->size() != n)
      return absl::InvalidArgumentError(
          "tokenizer.ggml.token_type: length differs from tokenizer.ggml.tokens");
    for (size_t i = 0; i < n; ++i) t->types_[i] = static_cast<TokenType>((*types)[i]);
  }
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return Required(merges.status());
  t->merge_rank_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string_view m = (*merges)[i];
    if (m.find(' ', 1) == std::string_view::npos) {
      return absl::InvalidArgumentError(
          StrCat("tokenizer.ggml.merges: entry ", i, " has no separating space"));
    }
    t->merge_rank_.emplace(std::string(m), static_cast<int32_t>(i));
  }
  auto id_or = [&](std::string_view key, TokenId dflt) -> absl::StatusOr<TokenId> {
    if (!f.Find(key)) return dflt;
    auto v = f.GetUint(key);
    if (!v.ok()) return v.status();
    if (*v >= n)
      return absl::InvalidArgumentError(StrCat(key, " = ", *v, " is outside the vocabulary"));
    return static_cast<TokenId>(*v);
  };
  auto bos = id_or("tokenizer.ggml.bos_token_id", -1);
  if (!bos.ok()) return bos.status();
  auto eos = id_or("tokenizer.ggml.eos_token_id", -1);
  if (!eos.ok()) return eos.status();
  t->bos_ = *bos;
  t->eos_ = *eos;
  if (f.Find("tokenizer.ggml.add_bos_token")) {
    auto ab = f.GetBool("tokenizer.ggml.add_bos_token");
    if (!ab.ok()) return ab.status();
    t->add_bos_ = *ab && t->bos_ >= 0;
  }
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = t->types_[i];
    if ((ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown) &&
        !t->tokens_[i].empty()) {
      t->special_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(t->special_.begin(), t->special_.end(), [&](TokenId a, TokenId b) {
    return t->tokens_[a].size() > t->tokens_[b].size();
  });
  if (t->eos_ >= 0) t->eog_.push_back(t->eos_);
  for (const char* s : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"}) {
    const TokenId id = t->Find(s);
    if (id >= 0 && t->types_[id] == TokenType::kControl) t->eog_.push_back(id);
  }
  return t;
}

TokenId Tokenizer::Find(std::string_view token_text) const {
  auto it = token_to_id_.find(std::string(token_text));
  return it == token_to_id_.end() ? -1 : it->second;
}

bool Tokenizer::IsEndOfGeneration(TokenId id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

void Tokenizer::SplitPieces(std::string_view text, std::vector<std::string_view>* pieces) const {
  std::vector<Cp> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const uint32_t cp = NextCodepoint(text, i, &len);
    cps.push_back(Classify(cp, static_cast<uint32_t>(i)));
    i += len;
  }
  std::vector<size_t> ends;
  if (split_digits_) {
    // First pass (\p{N}): every digit is a piece of its own; the GPT-2 pattern runs on the
    // stretches between them.
    size_t b = 0;
    for (size_t i = 0; i < cps.size(); ++i) {
      if (!cps[i].number) continue;
      Gpt2Split(cps, b, i, &ends);
      ends.push_back(i + 1);
      b = i + 1;
    }
    Gpt2Split(cps, b, cps.size(), &ends);
  } else {
    Gpt2Split(cps, 0, cps.size(), &ends);
  }
  size_t start = 0;
  for (size_t e : ends) {
    const size_t b0 = cps[start].offset;
    const size_t b1 = e < cps.size() ? cps[e].offset : text.size();
    pieces->push_back(text.substr(b0, b1 - b0));
    start = e;
  }
}

void Tokenizer::BpeEncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
  // Symbols start as the byte-unicode characters of the piece's bytes.
  const ByteMap& bm = Bytes();
  std::vector<std::string> sym;
  sym.reserve(piece.size());
  for (unsigned char ch : piece) sym.push_back(bm.byte_to_utf8[ch]);
  // Linked list of symbols; a min-heap of candidate merges keyed by (rank, left position).
  const int n = static_cast<int>(sym.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int left, right;
    size_t len;  // combined length when queued, to detect stale entries
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  std::string key;
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    key.assign(sym[l]).append(" ").append(sym[r]);
    auto it = merge_rank_.find(key);
    if (it != merge_rank_.end()) heap.push({it->second, l, r, sym[l].size() + sym[r].size()});
  };
  for (int i = 0; i + 1 < n; ++i) try_pair(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale if either side was merged away or changed since the candidate was queued.
    if (sym[c.left].empty() || sym[c.right].empty() || next[c.left] != c.right ||
        sym[c.left].size() + sym[c.right].size() != c.len) {
      continue;
    }
    sym[c.left] += sym[c.right];
    sym[c.right].clear();
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    try_pair(prev[c.left], c.left);
    try_pair(c.left, next[c.left]);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) {
    const TokenId id = Find(sym[i]);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Not in the vocabulary (cannot happen with a complete byte-level vocab): fall back to the
    // symbol's single characters, skipping any the vocabulary lacks.
    for (size_t k = 0; k < sym[i].size();) {
      size_t len;
      NextCodepoint(sym[i], k, &len);
      const TokenId b = Find(std::string_view(sym[i]).substr(k, len));
      if (b >= 0) out->push_back(b);
      k += len;
    }
  }
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> out;
  if (add_bos_) out.push_back(bos_);
  // Split around special tokens (longest first) into (is_special, text) fragments.
  struct Frag {
    TokenId special;  // -1: raw text
    std::string_view text;
  };
  std::vector<Frag> frags{{-1, text}};
  for (TokenId sid : special_) {
    if (!parse_special && types_[sid] != TokenType::kUserDefined) continue;
    const std::string& st = tokens_[sid];
    std::vector<Frag> next;
    for (const Frag& fr : frags) {
      if (fr.special >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t from = 0;
      for (;;) {
        const size_t at = fr.text.find(st, from);
        if (at == std::string_view::npos) break;
        if (at > from) next.push_back({-1, fr.text.substr(from, at - from)});
        next.push_back({sid, {}});
        from = at + st.size();
      }
      if (from < fr.text.size()) next.push_back({-1, fr.text.substr(from)});
    }
    frags.swap(next);
  }
  std::vector<std::string_view> pieces;
  for (const Frag& fr : frags) {
    if (fr.special >= 0) {
      out.push_back(fr.special);
      continue;
    }
    pieces.clear();
    SplitPieces(fr.text, &pieces);
    for (std::string_view p : pieces) BpeEncodePiece(p, &out);
  }
  return out;
}

std::string Tokenizer::TokenBytes(TokenId id, bool special) const {
  if (id < 0 || id >= vocab_size()) return {};
  const TokenType ty = types_[id];
  if (ty == TokenType::kControl || ty == TokenType::kUnknown)
    return special ? tokens_[id] : std::string();
  if (ty == TokenType::kUserDefined) return tokens_[id];
  const ByteMap& bm = Bytes();
  const std::string& s = tokens_[id];
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const uint32_t cp = NextCodepoint(s, i, &len);
    auto it = bm.cp_to_byte.find(cp);
    if (it != bm.cp_to_byte.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out;
}

std::string Tokenizer::Decode(const std::vector<TokenId>& ids, bool special) const {
  std::string out;
  for (TokenId id : ids) out += TokenBytes(id, special);
  return out;
}

}  // namespace kvmesh::model
