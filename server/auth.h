// Small pieces both network servers share.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvmesh::server {

// Compares an offered API key with the expected one in time independent of where they differ.
inline bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// A status's message as a std::string (Debian's Abseil has its own string_view).
inline std::string StatusText(const absl::Status& s) {
  return std::string(s.message().data(), s.message().size());
}

}  // namespace kvmesh::server
