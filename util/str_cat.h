// StrCat: concatenates strings and numbers into a std::string; Fixed: a number with a fixed
// count of decimals.
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

// v with `digits` digits after the point ("%.*f"): times and rates printed for people.
inline std::string Fixed(double v, int digits = 1) {
  const int n = std::snprintf(nullptr, 0, "%.*f", digits, v);
  std::string out(static_cast<size_t>(n > 0 ? n : 0), '\0');
  if (n > 0) std::snprintf(out.data(), out.size() + 1, "%.*f", digits, v);
  return out;
}

}  // namespace kvmesh
