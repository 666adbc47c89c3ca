// Test helper: writes GGUF files byte by byte, including deliberately malformed ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace kvmesh::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  GgufBuilder& U32(const std::string& key, uint32_t v) { return Scalar(key, 4, &v, 4); }
  GgufBuilder& I32(const std::string& key, int32_t v) { return Scalar(key, 5, &v, 4); }
  GgufBuilder& U8(const std::string& key, uint8_t v) { return Scalar(key, 0, &v, 1); }
  GgufBuilder& I16(const std::string& key, int16_t v) { return Scalar(key, 3, &v, 2); }
  GgufBuilder& U64(const std::string& key, uint64_t v) { return Scalar(key, 10, &v, 8); }
  GgufBuilder& F32(const std::string& key, float v) { return Scalar(key, 6, &v, 4); }
  GgufBuilder& Bool(const std::string& key, bool v) {
    uint8_t b = v;
    return Scalar(key, 7, &b, 1);
  }
  GgufBuilder& Str(const std::string& key, const std::string& v) {
    Key(key);
    Put<uint32_t>(kv_, 8);
    PutStr(kv_, v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& StrArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key);
    Put<uint32_t>(kv_, 9);
    Put<uint32_t>(kv_, 8);
    Put<uint64_t>(kv_, v.size());
    for (const auto& s : v) PutStr(kv_, s);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& I32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key);
    Put<uint32_t>(kv_, 9);
    Put<uint32_t>(kv_, 5);
    Put<uint64_t>(kv_, v.size());
    for (int32_t x : v) Put<int32_t>(kv_, x);
    ++n_kv_;
    return *this;
  }
  // A key with an arbitrary (possibly invalid) type id and raw payload.
  GgufBuilder& RawKv(const std::string& key, uint32_t type, const std::string& payload) {
    Key(key);
    Put<uint32_t>(kv_, type);
    kv_ += payload;
    ++n_kv_;
    return *this;
  }

  // A tensor; `data` is written at the next aligned offset unless `offset` overrides it.
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                      std::string data, std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(dims), type, std::move(data), offset});
    return *this;
  }

  std::string Build() const {
    std::string out;
    Put<uint32_t>(out, 0x46554747);
    Put<uint32_t>(out, version_);
    Put<uint64_t>(out, tensors_.size());
    Put<uint64_t>(out, n_kv_);
    out += kv_;
    std::string data;
    for (const auto& t : tensors_) {
      PutStr(out, t.name);
      Put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) Put<uint64_t>(out, d);
      Put<uint32_t>(out, t.type);
      while (data.size() % 32) data.push_back('\0');
      Put<uint64_t>(out, t.offset ? *t.offset : data.size());
      data += t.data;
    }
    while (out.size() % 32) out.push_back('\0');
    return out + data;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
    std::optional<uint64_t> offset;
  };
  template <typename V>
  static void Put(std::string& s, V v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  static void PutStr(std::string& s, const std::string& v) {
    Put<uint64_t>(s, v.size());
    s += v;
  }
  void Key(const std::string& k) { PutStr(kv_, k); }
  GgufBuilder& Scalar(const std::string& key, uint32_t type, const void* v, size_t n) {
    Key(key);
    Put<uint32_t>(kv_, type);
    kv_.append(static_cast<const char*>(v), n);
    ++n_kv_;
    return *this;
  }

  uint32_t version_;
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

// Bytes of n floats.
inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace kvmesh::testing
