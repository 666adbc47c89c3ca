// Command-line flags for the kvmesh subcommands: "--name value", "--name=value" and boolean
// "--name"; names in `one_dash` (llama-bench's -p, -n, ...) are also "-p value" and are spelled
// that way in messages. Every value is validated; errors are one line naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvmesh::coordinator {

class Flags {
 public:
  // Parses argv[first..). `valued` names flags that take a value, `boolean` those that do not.
  // InvalidArgument for an unknown flag, a missing value, or a positional argument. "--help" or
  // "-h" where a flag may stand (not as another flag's value) ends the parse with help() set.
  static absl::StatusOr<Flags> Parse(int argc, char** argv, int first,
                                     const std::set<std::string>& valued,
                                     const std::set<std::string>& boolean,
                                     const std::set<std::string>& one_dash = {});

  // Adds `values` (from a config file) for flags not given on the command line; `spellings`
  // names where each came from, for the messages about it ("'port' in --config 'c.yaml'").
  void AddDefaults(const std::map<std::string, std::string>& values,
                   const std::map<std::string, std::string>& spellings = {}) {
    for (const auto& [k, v] : values) {
      if (!values_.emplace(k, v).second) continue;
      if (auto it = spellings.find(k); it != spellings.end()) spelled_[k] = it->second;
    }
  }

  // Help was asked for: the caller prints its usage on stdout and exits 0 (coordinator/usage.h).
  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // Gives `name` a value (another spelling of a flag: bench's -m for --model).
  void Set(const std::string& name, const std::string& value) { values_[name] = value; }
  std::string String(const std::string& name, const std::string& dflt) const;
  // InvalidArgument naming the flag if the value is not a number in [lo, hi].
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const;
  absl::StatusOr<double> Float(const std::string& name, double dflt, double lo, double hi) const;
  absl::StatusOr<uint64_t> Uint64(const std::string& name, uint64_t dflt) const;
  // The flag as its users write it: "--name", or "-p" for a one-dash name; for a value from a
  // config file, where it came from (AddDefaults).
  std::string Spelling(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> one_dash_;
  std::map<std::string, std::string> spelled_;
  bool help_ = false;
};

}  // namespace kvmesh::coordinator
