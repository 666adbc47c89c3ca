// `kvmesh serve --config FILE`: a YAML file with the knobs vLLM users know, e.g.
//   model: /models/SmolLM2-135M-Instruct.Q4_1.gguf
//   tensor_parallel_size: 2
//   max_num_seqs: 32
//   max_model_len: 4096
//   max_num_batched_tokens: 512
//   block_size: 16
//   enable_prefix_caching: true
//   kv_cache_mem: 1024          # MiB per rank
//   port: 8000
//   api_key_file: /etc/kvmesh/key
// Command-line flags override the file.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace kvmesh::coordinator {

// The file's settings as serve flag names and values ("true" for a set boolean flag).
// InvalidArgument naming the key (or the YAML error's line) for unknown keys, wrong types, or
// settings not supported yet (data_parallel_size > 1); NotFound if the file cannot be read.
absl::StatusOr<std::map<std::string, std::string>> LoadServeConfig(const std::string& path);

// The YAML key that sets serve flag `flag` ("port" for "port", "max_model_len" for "ctx-size");
// empty if none does.
std::string ConfigKeyOf(const std::string& flag);

}  // namespace kvmesh::coordinator
