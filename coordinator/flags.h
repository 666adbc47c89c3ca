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
  // InvalidArgument for an unknown flag, a missing value, or a positional argument.
  static absl::StatusOr<Flags> Parse(int argc, char** argv, int first,
                                     const std::set<std::string>& valued,
                                     const std::set<std::string>& boolean,
                                     const std::set<std::string>& one_dash = {});

  // Adds `values` (from a config file) for flags not given on the command line.
  void AddDefaults(const std::map<std::string, std::string>& values) {
    for (const auto& [k, v] : values) values_.emplace(k, v);
  }

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string String(const std::string& name, const std::string& dflt) const;
  // InvalidArgument naming the flag if the value is not a number in [lo, hi].
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t dflt, int64_t lo, int64_t hi) const;
  absl::StatusOr<double> Float(const std::string& name, double dflt, double lo, double hi) const;
  absl::StatusOr<uint64_t> Uint64(const std::string& name, uint64_t dflt) const;
  // The flag as its users write it: "--name", or "-p" for a one-dash name.
  std::string Spelling(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> one_dash_;
};

}  // namespace kvmesh::coordinator
