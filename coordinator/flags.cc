#include "coordinator/flags.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "util/str_cat.h"

namespace kvmesh::coordinator {

absl::StatusOr<Flags> Flags::Parse(int argc, char** argv, int first,
                                   const std::set<std::string>& valued,
                                   const std::set<std::string>& boolean,
                                   const std::set<std::string>& one_dash) {
  Flags f;
  f.one_dash_ = one_dash;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      f.help_ = true;
      return f;
    }
    const bool short_form =
        a.size() > 1 && a[0] == '-' && a[1] != '-' && one_dash.count(a.substr(1));
    if (!short_form && (a.rfind("--", 0) != 0 || a.size() == 2)) {
      return absl::InvalidArgumentError(StrCat("unexpected argument '", a, "'"));
    }
    std::string name = a.substr(short_form ? 1 : 2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (boolean.count(name)) {
      if (has_value)
        return absl::InvalidArgumentError(StrCat("flag ", f.Spelling(name), " takes no value"));
      f.values_[name] = std::string(1, '1');  // = "1" trips GCC 12's false -Wrestrict
      continue;
    }
    if (!valued.count(name)) return absl::InvalidArgumentError(StrCat("unknown flag --", name));
    if (!has_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(StrCat("flag ", f.Spelling(name), " needs a value"));
      value = argv[++i];
    }
    f.values_[name] = value;
  }
  return f;
}

std::string Flags::Spelling(const std::string& name) const {
  if (auto it = spelled_.find(name); it != spelled_.end()) return it->second;
  return StrCat(one_dash_.count(name) ? "-" : "--", name);
}

std::string Flags::String(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second;
}

namespace {
// A number as people write it: no blanks around it and no hexadecimal (strtoll / strtod take
// both, so " -1" passed as an unsigned seed and "0x10" as a temperature of 16).
bool PlainNumber(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front())) ||
      std::isspace(static_cast<unsigned char>(s.back()))) {
    return false;
  }
  return s.find_first_of("xX") == std::string::npos;
}
}  // namespace

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t dflt, int64_t lo,
                                   int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  const std::string& s = it->second;
  if (!PlainNumber(s)) {
    return absl::InvalidArgumentError(
        StrCat(Spelling(name), " must be an integer in [", lo, ", ", hi, "], got '", s, "'"));
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        StrCat(Spelling(name), " must be an integer in [", lo, ", ", hi, "], got '", s, "'"));
  }
  return v;
}

absl::StatusOr<double> Flags::Float(const std::string& name, double dflt, double lo,
                                    double hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  const std::string& s = it->second;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (!PlainNumber(s) || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        StrCat(Spelling(name), " must be a number in [", lo, ", ", hi, "], got '", s, "'"));
  }
  return v;
}

absl::StatusOr<uint64_t> Flags::Uint64(const std::string& name, uint64_t dflt) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (!PlainNumber(s) || s[0] == '-' || *end != '\0' || errno == ERANGE) {
    return absl::InvalidArgumentError(
        StrCat(Spelling(name), " must be a non-negative integer, got '", s, "'"));
  }
  return v;
}

}  // namespace kvmesh::coordinator
