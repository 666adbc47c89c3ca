// An API key read from a file (--api-key-file): its first line, at most 4 KiB, trailing blanks
// and CR dropped. A directory, a device without lines (/dev/zero), NUL bytes or an empty key
// are errors naming the file. ApiKeyFromFlags: the key serve and client were given.
#pragma once

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/flags.h"
#include "util/str_cat.h"

namespace kvmesh::coordinator {

// A key an HTTP client can send: no control character but a tab (a header's value cannot hold
// them) and no space or tab at its ends (HTTP drops those from a value, so it would never match).
inline absl::Status CheckKey(std::string_view key, std::string_view what) {
  for (unsigned char c : key) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return absl::InvalidArgumentError(StrCat(what, ": the key holds a control character"));
    }
  }
  if (!key.empty() &&
      (key.front() == ' ' || key.front() == '\t' || key.back() == ' ' || key.back() == '\t')) {
    return absl::InvalidArgumentError(StrCat(what, ": the key begins or ends with a blank"));
  }
  return absl::OkStatus();
}

inline absl::StatusOr<std::string> ReadKeyFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(StrCat("--api-key-file '", path, "' is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot read --api-key-file '", path, "'"));
  constexpr std::streamsize kMax = 4096;
  std::string line(kMax + 1, '\0');
  in.getline(line.data(), kMax + 1);
  if (in.fail() && !in.eof() && in.gcount() >= kMax) {
    return absl::InvalidArgumentError("--api-key-file: the key is longer than 4096 bytes");
  }
  // gcount() counts the newline getline consumed, if it found one.
  size_t n = static_cast<size_t>(in.gcount());
  if (n > 0 && !in.eof() && line[n - 1] == '\0') --n;
  line.resize(n);
  if (line.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("--api-key-file: the key holds a NUL byte");
  }
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.empty()) return absl::InvalidArgumentError("--api-key-file is empty");
  if (auto s = CheckKey(line, "--api-key-file"); !s.ok()) return s;
  return line;
}

// --api-key, or the first line of --api-key-file: one or the other, and not empty (an empty key
// would turn authentication off: a script passing an unset variable); "" if neither is given.
// Messages name the flags as f spells them, after `who` ("client: ").
inline absl::StatusOr<std::string> ApiKeyFromFlags(const Flags& f, std::string_view who = "") {
  if (f.Has("api-key") && f.Has("api-key-file")) {
    return absl::InvalidArgumentError(StrCat(who, "give ", f.Spelling("api-key"), " or ",
                                             f.Spelling("api-key-file"), ", not both"));
  }
  if (f.Has("api-key-file")) return ReadKeyFile(f.String("api-key-file", ""));
  std::string key = f.String("api-key", "");
  if (f.Has("api-key") && key.empty()) {
    return absl::InvalidArgumentError(StrCat(who, f.Spelling("api-key"), " is empty"));
  }
  if (auto s = CheckKey(key, StrCat(who, f.Spelling("api-key"))); !s.ok()) return s;
  return key;
}

}  // namespace kvmesh::coordinator
