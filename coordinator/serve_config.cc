#include "coordinator/serve_config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "util/str_cat.h"

namespace kvmesh::coordinator {

namespace {

enum class Kind { kString, kInt, kBool };
struct Key {
  const char* flag;
  Kind kind;
};

const std::map<std::string, Key>& Keys() {
  static const std::map<std::string, Key> keys = {
      {"model", {"model", Kind::kString}},
      {"served_model_name", {"served-model-name", Kind::kString}},
      {"host", {"host", Kind::kString}},
      {"port", {"port", Kind::kInt}},
      {"rpc_port", {"rpc-port", Kind::kInt}},
      {"api_key", {"api-key", Kind::kString}},
      {"api_key_file", {"api-key-file", Kind::kString}},
      {"max_num_seqs", {"max-seqs", Kind::kInt}},
      {"max_model_len", {"ctx-size", Kind::kInt}},
      {"max_num_batched_tokens", {"max-batched-tokens", Kind::kInt}},
      {"max_waiting", {"max-waiting", Kind::kInt}},
      {"block_size", {"block-size", Kind::kInt}},
      {"enable_prefix_caching", {"no-prefix-reuse", Kind::kBool}},
      {"kv_cache_mem", {"kv-cache-mem", Kind::kInt}},
      {"tensor_parallel_size", {"tp", Kind::kInt}},
      {"pipeline_parallel_size", {"pp", Kind::kInt}},
      {"data_parallel_size", {"dp", Kind::kInt}},
      {"threads", {"threads", Kind::kInt}},
      {"activation_bits", {"activation-bits", Kind::kInt}},
      {"attention_bits", {"attention-bits", Kind::kInt}},
      {"repack_weights", {"no-repack", Kind::kBool}},
      {"max_body_bytes", {"max-body-bytes", Kind::kInt}},
  };
  return keys;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> LoadServeConfig(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(StrCat("--config '", path, "' is a directory, not a file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("cannot open --config file '", path, "'"));
  std::map<std::string, std::string> out;
  try {
    const YAML::Node root = YAML::Load(in);
    if (root.IsNull()) return out;
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(StrCat("--config '", path, "': not a mapping of settings"));
    }
    std::set<std::string> seen;
    for (const auto& kv : root) {
      const std::string name = kv.first.as<std::string>();
      auto it = Keys().find(name);
      if (it == Keys().end()) {
        return absl::InvalidArgumentError(
            StrCat("--config '", path, "': unknown setting '", name, "'"));
      }
      // YAML leaves a repeated key to the reader; which one wins would be a guess.
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(StrCat("--config '", path, "': line ",
                                                 kv.first.Mark().line + 1, ": '", name,
                                                 "' is set twice"));
      }
      const YAML::Node& v = kv.second;
      if (!v.IsScalar()) {
        return absl::InvalidArgumentError(
            StrCat("--config '", path, "': '", name, "' must be a single value"));
      }
      const Key& key = it->second;
      if (key.kind == Kind::kInt) {
        int64_t n;
        if (!YAML::convert<int64_t>::decode(v, n)) {
          return absl::InvalidArgumentError(
              StrCat("--config '", path, "': '", name, "' must be an integer"));
        }
        out[key.flag] = std::to_string(n);
      } else if (key.kind == Kind::kBool) {
        bool b;
        if (!YAML::convert<bool>::decode(v, b)) {
          return absl::InvalidArgumentError(
              StrCat("--config '", path, "': '", name, "' must be true or false"));
        }
        // enable_prefix_caching: false -> --no-prefix-reuse (repack_weights: --no-repack)
        if (!b) out[key.flag] = "true";
      } else {
        out[key.flag] = v.as<std::string>();
      }
    }
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's message for it is "bad file"
    return absl::InvalidArgumentError(
        StrCat("--config '", path, "': line ", e.mark.line + 1, ": nested too deeply"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat("--config '", path, "': line ", e.mark.line + 1, ": ", e.msg));
  } catch (const std::exception& e) {  // a read error of the stream itself
    return absl::InvalidArgumentError(StrCat("--config '", path, "': cannot read: ", e.what()));
  }
  return out;
}

std::string ConfigKeyOf(const std::string& flag) {
  for (const auto& [key, k] : Keys()) {
    if (flag == k.flag) return key;
  }
  return "";
}

}  // namespace kvmesh::coordinator
