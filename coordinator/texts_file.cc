#include "coordinator/texts_file.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/str_cat.h"

namespace kvmesh::coordinator {

using nlohmann::json;

absl::StatusOr<std::vector<std::string>> ReadTexts(const std::string& what,
                                                   const std::string& path) {
  constexpr size_t kMaxBytes = 64 << 20;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(StrCat(what, " file '", path, "' is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open ", what, " file '", path, "'"));
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes) {
      return absl::InvalidArgumentError(
          StrCat(what, " file '", path, "' is larger than ", kMaxBytes >> 20, " MiB"));
    }
  }
  std::vector<std::string> turns;
  // JSON when the file is named *.json or begins as an array of strings does ('[' then '"' or
  // ']'), so a broken one is an error; otherwise lines (a first turn "[INST] ..." or "[1, 2]").
  const bool named_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t second =
      first == std::string::npos ? first : text.find_first_not_of(" \t\r\n", first + 1);
  const bool looks_json = first != std::string::npos && text[first] == '[' &&
                          second != std::string::npos &&
                          (text[second] == '"' || text[second] == ']');
  if (named_json || looks_json) {
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError(
          StrCat(what, " file '", path, "': not a JSON array of strings"));
    }
    for (const auto& t : j) {
      if (!t.is_string()) {
        return absl::InvalidArgumentError(
            StrCat(what, " file '", path, "': every entry must be a string"));
      }
      turns.push_back(t.get<std::string>());
    }
  } else {
    std::string line;
    std::istringstream lines(text);
    while (std::getline(lines, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
      if (line.find_first_not_of(" \t") != std::string::npos) turns.push_back(line);
    }
  }
  if (turns.empty()) return absl::InvalidArgumentError(StrCat(what, " file '", path, "' is empty"));
  return turns;
}

}  // namespace kvmesh::coordinator
