// StrCat: concatenates strings and numbers into a std::string.
//
// kvmesh's own, because Debian's Abseil is built with its own absl::string_view (not
// std::string_view), so absl::StrCat does not accept std::string_view arguments.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace kvmesh {

namespace internal {
inline void AppendOne(std::string& out, std::string_view s) { out.append(s); }
inline void AppendOne(std::string& out, const char* s) { out.append(s); }
inline void AppendOne(std::string& out, const std::string& s) { out.append(s); }
inline void AppendOne(std::string& out, char c) { out.push_back(c); }
#if !defined(ABSL_USES_STD_STRING_VIEW)
inline void AppendOne(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
#endif
template <typename T>
requires std::is_arithmetic_v<T> &&
    (!std::is_same_v<T, char>)inline void AppendOne(std::string& out, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    out.append(v ? "true" : "false");
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
    out.append(buf);
  } else {
    out.append(std::to_string(v));
  }
}
}  // namespace internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (internal::AppendOne(out, args), ...);
  return out;
}

}  // namespace kvmesh
