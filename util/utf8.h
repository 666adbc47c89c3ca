// UTF-8 helpers for text streamed token by token (a token may end inside a character).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvmesh {

// Length of the longest prefix of `s` that does not end inside a multi-byte character: the
// bytes after it wait for the next token. (Trailing bytes that cannot start a character count
// as complete.)
inline size_t CompleteUtf8Prefix(std::string_view s) {
  size_t keep = 0;
  for (size_t i = s.size(); i > 0 && keep < 4; --i, ++keep) {
    const auto b = static_cast<unsigned char>(s[i - 1]);
    if ((b & 0xC0) != 0x80) {
      const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
      return keep + 1 >= need ? s.size() : i - 1;
    }
  }
  return s.size();
}

// `s` with every invalid UTF-8 sequence (stray continuation bytes, overlong forms, surrogates,
// values past U+10FFFF, truncated characters) replaced by U+FFFD.
inline std::string ValidUtf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && n > 1) {
      uint32_t cp = c & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      ok = cp >= (n == 2   ? 0x80u
                  : n == 3 ? 0x800u
                           : 0x10000u) &&
           cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace kvmesh
