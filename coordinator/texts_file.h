// A multi-turn script or a batch of prompts from a file (kvmesh run --session / --prompts,
// kvmesh client session --turns): a JSON array of strings (a *.json file, or a file that begins
// as one: '[' then '"' or ']'), or one text per non-empty line (CRLF ends dropped). At most
// 64 MiB (a pipe or /dev/stdin is fine; /dev/zero or a huge file is refused, not read until
// memory runs out). Errors are one line naming `what` (e.g. "session") and the file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::coordinator {

absl::StatusOr<std::vector<std::string>> ReadTexts(const std::string& what,
                                                   const std::string& path);

}  // namespace kvmesh::coordinator
