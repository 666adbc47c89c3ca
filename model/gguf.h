// A validated, memory-mapped GGUF file (versions 2 and 3).
//
// Open() checks the whole header before returning: magic, version, counts, every key/value and
// string/array length against the bytes that remain, value types, tensor shapes (n_dims <= 4,
// overflow-checked element counts), tensor types, rows a whole number of blocks, and each
// tensor's data aligned and inside the file. Nothing is allocated in proportion to a count that
// the file has not backed with bytes. Errors are InvalidArgument (NotFound / Internal for I/O)
// and name the offending key or tensor. A GgufFile is immutable and safe to share across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/quant.h"

namespace kvmesh::model {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Strings and array payloads point into the mapped file.
struct GgufValue {
  GgufType type = GgufType::kU8;
  // Scalars: integers and bools in `i` (unsigned values that overflow int64 keep `u`), floats in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string_view str;
  // Arrays: element type, count, and for numeric elements the packed little-endian payload;
  // for string elements `strings`.
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  const uint8_t* data = nullptr;
  std::vector<std::string_view> strings;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] is the row length (contiguous), as in ggml's ne[]
  kernels::DType type = kernels::DType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  int64_t rows() const;  // product of dims[1..]
};

class GgufFile {
 public:
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Maps and validates `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Validates bytes the caller keeps alive for the lifetime of the result (no copy).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::string>& keys() const { return key_order_; }

  const GgufValue* Find(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // Start of a tensor's data (inside the mapping).
  const uint8_t* TensorData(const GgufTensorInfo& t) const { return data_ + t.offset; }
  size_t file_size() const { return bytes_.size(); }
  // Tells the kernel this process no longer needs the mapped pages wholly inside [p, p + n)
  // (MADV_DONTNEED: they leave the resident set and are read again from the file if touched).
  // For a tensor-parallel rank that has copied out its slices. No-op for FromBytes files.
  void DropPages(const void* p, size_t n) const;
  // Offset of the data section from the start of the file.
  uint64_t data_offset() const { return static_cast<uint64_t>(data_ - bytes_.data()); }
  // The bytes before the tensor data: the header, metadata and tensor table.
  std::string_view header() const {
    return {reinterpret_cast<const char*>(bytes_.data()), static_cast<size_t>(data_offset())};
  }

  // Typed getters: NotFound if absent, InvalidArgument (naming the key) on a type mismatch or a
  // value out of range. Integer getters accept any integer type.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;  // any float or integer type
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::span<const uint8_t> bytes_;
  void* map_ = nullptr;  // owned mmap region (null for FromBytes)
  size_t map_len_ = 0;
  const uint8_t* data_ = nullptr;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::unordered_map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// A key a model cannot load without: a getter's NotFound becomes InvalidArgument (the file is
// malformed; NotFound is kept for a model file that does not exist).
inline absl::Status Required(const absl::Status& s) {
  return absl::IsNotFound(s) ? absl::InvalidArgumentError(s.message()) : s;
}

// The ggml name of a tensor type id ("Q5_0", ...), or "type N" when unknown.
std::string GgmlTypeName(uint32_t type_id);

}  // namespace kvmesh::model
