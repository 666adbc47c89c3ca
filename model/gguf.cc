#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/str_cat.h"

namespace kvmesh::model {
namespace {

using absl::InvalidArgumentError;

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;

const char* TypeName(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "?";
}

// Fixed size of a scalar type, 0 for string/array, -1 for an unknown type id.
int ScalarSize(uint32_t t) {
  switch (static_cast<GgufType>(t)) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return -1;
}

bool IsInteger(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

// Bounds-checked little-endian reader over the file bytes.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }

  template <typename T>
  bool Read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string_view* out) {
    uint64_t len;
    if (!Read(&len) || len > remaining()) return false;
    *out = std::string_view(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return true;
  }
  const uint8_t* Take(uint64_t n) {
    if (n > remaining()) return nullptr;
    const uint8_t* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

// Reads one scalar of type t into v (t must be a scalar type).
void ReadScalar(Cursor& c, GgufType t, GgufValue* v) {
  switch (t) {
    case GgufType::kU8: {
      uint8_t x = 0;
      c.Read(&x);
      v->u = x;
      v->i = x;
      break;
    }
    case GgufType::kI8: {
      int8_t x = 0;
      c.Read(&x);
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case GgufType::kBool: {
      uint8_t x = 0;
      c.Read(&x);
      v->i = x;
      v->u = x;
      break;
    }
    case GgufType::kU16: {
      uint16_t x = 0;
      c.Read(&x);
      v->u = x;
      v->i = x;
      break;
    }
    case GgufType::kI16: {
      int16_t x = 0;
      c.Read(&x);
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case GgufType::kU32: {
      uint32_t x = 0;
      c.Read(&x);
      v->u = x;
      v->i = x;
      break;
    }
    case GgufType::kI32: {
      int32_t x = 0;
      c.Read(&x);
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case GgufType::kU64: {
      uint64_t x = 0;
      c.Read(&x);
      v->u = x;
      v->i = static_cast<int64_t>(x);
      break;
    }
    case GgufType::kI64: {
      int64_t x = 0;
      c.Read(&x);
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case GgufType::kF32: {
      float x = 0;
      c.Read(&x);
      v->f = x;
      break;
    }
    case GgufType::kF64: {
      double x = 0;
      c.Read(&x);
      v->f = x;
      break;
    }
    default:
      break;
  }
}

// Skips (validating) an array of `count` elements of element type `et`, for nested arrays.
absl::Status SkipArray(Cursor& c, uint32_t et, uint64_t count, int depth, std::string_view key) {
  const int sz = ScalarSize(et);
  if (sz < 0)
    return InvalidArgumentError(StrCat("gguf: key '", key, "': unknown array element type ", et));
  if (sz > 0) {
    if (count > c.remaining() / sz) {
      return InvalidArgumentError(
          StrCat("gguf: key '", key, "': array of ", count, " elements runs past end of file"));
    }
    c.Take(count * sz);
    return absl::OkStatus();
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (et == static_cast<uint32_t>(GgufType::kString)) {
      std::string_view s;
      if (!c.ReadString(&s))
        return InvalidArgumentError(
            StrCat("gguf: key '", key, "': string in array runs past end of file"));
    } else {
      if (depth >= kMaxArrayDepth)
        return InvalidArgumentError(StrCat("gguf: key '", key, "': arrays nested too deeply"));
      uint32_t inner;
      uint64_t n;
      if (!c.Read(&inner) || !c.Read(&n))
        return InvalidArgumentError(StrCat("gguf: key '", key, "': truncated nested array"));
      if (auto st = SkipArray(c, inner, n, depth + 1, key); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string GgmlTypeName(uint32_t type_id) {
  if (auto tr = kernels::TraitsOf(type_id)) return std::string(tr->name);
  static const char* const kNames[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
      "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
      "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (type_id < sizeof(kNames) / sizeof(kNames[0])) return kNames[type_id];
  return StrCat(type_id);
}

int64_t GgufTensorInfo::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
  return r;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) munmap(map_, map_len_);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = StrCat("cannot open model file '", path, "': ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(StrCat("model file '", path, "' is not a regular file"));
  }
  const size_t len = static_cast<size_t>(st.st_size);
  if (len < 8) {
    ::close(fd);
    return InvalidArgumentError(StrCat("'", path, "' is not a GGUF file: only ", len, " bytes"));
  }
  void* map = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED)
    return absl::InternalError(StrCat("mmap '", path, "': ", std::strerror(errno)));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->map_ = map;
  f->map_len_ = len;
  f->bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(map), len);
  if (auto s = f->Parse(); !s.ok()) {
    return absl::Status(s.code(), StrCat(path, ": ", s.message()));
  }
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::span<const uint8_t> bytes) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->bytes_ = bytes;
  if (auto s = f->Parse(); !s.ok()) return s;
  return f;
}

absl::Status GgufFile::Parse() {
  Cursor c(bytes_);
  uint32_t magic = 0;
  if (!c.Read(&magic) || magic != kMagic) return InvalidArgumentError("not a GGUF file: bad magic");
  if (!c.Read(&version_)) return InvalidArgumentError("gguf: truncated header");
  if (version_ != 2 && version_ != 3) {
    return InvalidArgumentError(StrCat("gguf: unsupported version ", version_, " (want 2 or 3)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.Read(&n_tensors) || !c.Read(&n_kv)) return InvalidArgumentError("gguf: truncated header");
  // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least
  // 8 + 4 + 8 + 4 + 8 (name length, n_dims, one dim, type, offset). Reject counts the file
  // cannot hold before reserving anything.
  if (n_kv > c.remaining() / 13) {
    return InvalidArgumentError(
        StrCat("gguf: key/value count ", n_kv, " exceeds what the file can hold"));
  }
  if (n_tensors > c.remaining() / 32) {
    return InvalidArgumentError(
        StrCat("gguf: tensor count ", n_tensors, " exceeds what the file can hold"));
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string_view key;
    if (!c.ReadString(&key))
      return InvalidArgumentError(StrCat("gguf: key #", k, ": key string runs past end of file"));
    uint32_t type = 0;
    if (!c.Read(&type))
      return InvalidArgumentError(StrCat("gguf: key '", key, "': truncated value type"));
    const int sz = ScalarSize(type);
    if (sz < 0)
      return InvalidArgumentError(StrCat("gguf: key '", key, "': unknown value type ", type));
    GgufValue v;
    v.type = static_cast<GgufType>(type);
    if (sz > 0) {
      if (c.remaining() < static_cast<size_t>(sz))
        return InvalidArgumentError(StrCat("gguf: key '", key, "': value runs past end of file"));
      ReadScalar(c, v.type, &v);
    } else if (v.type == GgufType::kString) {
      if (!c.ReadString(&v.str))
        return InvalidArgumentError(
            StrCat("gguf: key '", key, "': string length runs past end of file"));
    } else {  // array
      uint32_t et = 0;
      if (!c.Read(&et) || !c.Read(&v.count))
        return InvalidArgumentError(StrCat("gguf: key '", key, "': truncated array header"));
      const int esz = ScalarSize(et);
      if (esz < 0)
        return InvalidArgumentError(
            StrCat("gguf: key '", key, "': unknown array element type ", et));
      v.elem_type = static_cast<GgufType>(et);
      if (esz > 0) {
        if (v.count > c.remaining() / esz) {
          return InvalidArgumentError(StrCat("gguf: key '", key, "': array of ", v.count,
                                             " elements runs past end of file"));
        }
        v.data = c.Take(v.count * esz);
      } else if (v.elem_type == GgufType::kString) {
        if (v.count > c.remaining() / 8) {
          return InvalidArgumentError(StrCat("gguf: key '", key, "': array of ", v.count,
                                             " strings runs past end of file"));
        }
        v.strings.reserve(std::min<uint64_t>(v.count, 1u << 16));  // grows with bytes read
        for (uint64_t i = 0; i < v.count; ++i) {
          std::string_view s;
          if (!c.ReadString(&s))
            return InvalidArgumentError(
                StrCat("gguf: key '", key, "': string #", i, " runs past end of file"));
          v.strings.push_back(s);
        }
      } else {
        if (auto st = SkipArray(c, et, v.count, 1, key); !st.ok()) return st;
      }
    }
    std::string skey(key);
    if (kv_.count(skey)) return InvalidArgumentError(StrCat("gguf: duplicate key '", key, "'"));
    key_order_.push_back(skey);
    kv_.emplace(std::move(skey), std::move(v));
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (!IsInteger(a->type) || a->u == 0 || a->u > (1u << 20) || (a->u & (a->u - 1)) != 0) {
      return InvalidArgumentError(
          "gguf: key 'general.alignment': must be a power of two integer <= 1 MiB");
    }
    alignment_ = a->u;
  }

  tensors_.reserve(std::min<uint64_t>(n_tensors, 1u << 12));  // grows with bytes read
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    GgufTensorInfo t;
    std::string_view name;
    if (!c.ReadString(&name))
      return InvalidArgumentError(StrCat("gguf: tensor #", ti, ": name runs past end of file"));
    t.name = std::string(name);
    uint32_t n_dims = 0;
    if (!c.Read(&n_dims))
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': truncated"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return InvalidArgumentError(
          StrCat("gguf: tensor '", t.name, "': n_dims ", n_dims, " not in [1, 4]"));
    }
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (!c.Read(&dim))
        return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': truncated dims"));
      if (dim == 0 || dim > static_cast<uint64_t>(INT64_MAX)) {
        return InvalidArgumentError(
            StrCat("gguf: tensor '", t.name, "': dim ", d, " = ", dim, " is invalid"));
      }
      if (MulOverflows(n_el, dim, &n_el) || n_el > static_cast<uint64_t>(INT64_MAX)) {
        return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': element count overflows"));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    uint32_t type = 0;
    if (!c.Read(&type) || !c.Read(&t.offset))
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': truncated"));
    const auto tr = kernels::TraitsOf(type);
    if (!tr) {
      return InvalidArgumentError(
          StrCat("gguf: tensor '", t.name, "': unsupported tensor type ", GgmlTypeName(type)));
    }
    t.type = static_cast<kernels::DType>(type);
    if (t.dims[0] % tr->block_elems != 0) {
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': row of ", t.dims[0],
                                         " elements is not a multiple of the ", tr->name,
                                         " block size ", tr->block_elems));
    }
    t.n_elements = n_el;
    uint64_t bytes = 0;
    if (MulOverflows(n_el / tr->block_elems, tr->block_bytes, &bytes)) {
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': byte size overflows"));
    }
    t.n_bytes = bytes;
    if (t.offset % alignment_ != 0) {
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': offset ", t.offset,
                                         " is not aligned to ", alignment_));
    }
    if (tensor_index_.count(t.name))
      return InvalidArgumentError(StrCat("gguf: duplicate tensor name '", t.name, "'"));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = c.pos();
  const uint64_t data_start = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > bytes_.size() && !tensors_.empty()) {
    return InvalidArgumentError("gguf: data section starts past end of file");
  }
  const uint64_t data_len = data_start <= bytes_.size() ? bytes_.size() - data_start : 0;
  for (const auto& t : tensors_) {
    if (t.offset > data_len || t.n_bytes > data_len - t.offset) {
      return InvalidArgumentError(StrCat("gguf: tensor '", t.name, "': data [", t.offset, ", +",
                                         t.n_bytes, ") runs past end of file (data section is ",
                                         data_len, " bytes)"));
    }
  }
  data_ = bytes_.data() + std::min<uint64_t>(data_start, bytes_.size());
  return absl::OkStatus();
}

void GgufFile::DropPages(const void* p, size_t n) const {
  if (map_ == nullptr) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  const auto map_lo = reinterpret_cast<uintptr_t>(map_);
  if (hi <= lo || lo < map_lo || hi > map_lo + map_len_) return;
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(StrCat("gguf: missing key '", key, "'"));
}
absl::Status WrongType(std::string_view key, GgufType got, std::string_view want) {
  return InvalidArgumentError(
      StrCat("gguf: key '", key, "' has type ", TypeName(got), ", want ", want));
}
bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}
}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsInteger(v->type)) return WrongType(key, v->type, "an integer");
  if (IsSigned(v->type) && v->i < 0)
    return InvalidArgumentError(StrCat("gguf: key '", key, "' is negative (", v->i, ")"));
  return v->u;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsInteger(v->type)) return WrongType(key, v->type, "an integer");
  if (v->type == GgufType::kU64 && v->u > static_cast<uint64_t>(INT64_MAX)) {
    return InvalidArgumentError(StrCat("gguf: key '", key, "' is out of range"));
  }
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64) return v->f;
  if (IsInteger(v->type))
    return IsSigned(v->type) ? static_cast<double>(v->i) : static_cast<double>(v->u);
  return WrongType(key, v->type, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kBool) return WrongType(key, v->type, "bool");
  return v->i != 0;
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kString) return WrongType(key, v->type, "string");
  return v->str;
}

absl::StatusOr<std::span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString)
    return WrongType(key, v->type, "array of strings");
  return std::span<const std::string_view>(v->strings);
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kArray || !IsInteger(v->elem_type))
    return WrongType(key, v->type, "array of integers");
  const int sz = ScalarSize(static_cast<uint32_t>(v->elem_type));
  std::vector<int64_t> out;
  out.reserve(v->count);
  Cursor c(std::span<const uint8_t>(v->data, v->count * sz));
  for (uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    ReadScalar(c, v->elem_type, &e);
    out.push_back(e.i);
  }
  return out;
}

}  // namespace kvmesh::model
