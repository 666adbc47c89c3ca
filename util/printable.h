// Outside bytes made safe for one line of a terminal or log: control and non-ASCII bytes as
// \xNN, the whole cut to at most `max` characters (a file's names and strings reach error
// messages, and a crafted one must not print escapes, extra lines or megabytes).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace kvmesh::util {

inline std::string Printable(std::string_view s, size_t max = 400) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace kvmesh::util
