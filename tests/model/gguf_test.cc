#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <span>

#include "tests/util/gguf_builder.h"

namespace kvmesh::model {
namespace {

using testing::FloatBytes;
using testing::GgufBuilder;

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& bytes) {
  return GgufFile::FromBytes(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

GgufBuilder Valid() {
  GgufBuilder b;
  b.Str("general.architecture", "llama")
      .U32("llama.block_count", 2)
      .I16("some.small_int", 7)
      .F32("some.float", 0.5f)
      .Bool("some.flag", true)
      .StrArray("tokenizer.ggml.tokens", {"a", "b", "ccc"})
      .I32Array("tokenizer.ggml.token_type", {1, 1, 3})
      .Tensor("w", {4, 2}, 0, FloatBytes({1, 2, 3, 4, 5, 6, 7, 8}))
      .Tensor("v", {32}, 0, FloatBytes(std::vector<float>(32, 0.25f)));
  return b;
}

void ExpectError(const std::string& bytes, const std::string& needle) {
  auto f = Parse(bytes);
  ASSERT_FALSE(f.ok()) << "accepted a file that should fail with: " << needle;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(f.status().message()).find(needle), std::string::npos)
      << "error '" << f.status().message() << "' does not mention '" << needle << "'";
}

template <typename T>
std::string Patch(std::string s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof(v));
  return s;
}

TEST(Gguf, RoundTripsAWrittenFile) {
  const std::string bytes = Valid().Build();
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetUint("llama.block_count"), 2u);
  EXPECT_EQ(*(*f)->GetInt("some.small_int"), 7);  // any integer type is accepted
  EXPECT_EQ(*(*f)->GetUint("some.small_int"), 7u);
  EXPECT_FLOAT_EQ(*(*f)->GetFloat("some.float"), 0.5f);
  EXPECT_TRUE(*(*f)->GetBool("some.flag"));
  auto toks = (*f)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks.ok());
  ASSERT_EQ(toks->size(), 3u);
  EXPECT_EQ((*toks)[2], "ccc");
  EXPECT_EQ(*(*f)->GetIntArray("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 1, 3}));
  const GgufTensorInfo* w = (*f)->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(w->n_bytes, 32u);
  EXPECT_EQ(w->rows(), 2);
  const float* data = reinterpret_cast<const float*>((*f)->TensorData(*w));
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_EQ(data[7], 8.0f);
  const GgufTensorInfo* v = (*f)->FindTensor("v");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>((*f)->TensorData(*v))[31], 0.25f);
  EXPECT_EQ((*f)->FindTensor("nope"), nullptr);
}

TEST(Gguf, TypedGettersNameTheKey) {
  const std::string bytes = Valid().Build();
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok());
  auto s = (*f)->GetUint("general.architecture");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.status().message()).find("general.architecture"), std::string::npos);
  EXPECT_EQ((*f)->GetString("missing.key").status().code(), absl::StatusCode::kNotFound);
}

TEST(Gguf, AcceptsVersion2) {
  GgufBuilder b(2);
  b.Str("general.architecture", "llama");
  EXPECT_TRUE(Parse(b.Build()).ok());
}

TEST(Gguf, RejectsBadMagic) {
  ExpectError(Patch(Valid().Build(), 0, uint32_t{0x12345678}), "bad magic");
}

TEST(Gguf, RejectsVersion1And99) {
  ExpectError(Patch(Valid().Build(), 4, uint32_t{1}), "unsupported version 1");
  ExpectError(Patch(Valid().Build(), 4, uint32_t{99}), "unsupported version 99");
}

TEST(Gguf, RejectsHugeTensorCount) {
  ExpectError(Patch(Valid().Build(), 8, ~uint64_t{0}), "tensor count 18446744073709551615");
}

TEST(Gguf, RejectsHugeKvCount) {
  ExpectError(Patch(Valid().Build(), 16, uint64_t{1} << 40), "key/value count");
}

TEST(Gguf, RejectsHugeStringLength) {
  // The first key's length field sits right after the 24-byte header.
  ExpectError(Patch(Valid().Build(), 24, uint64_t{1} << 63), "key #0");
}

TEST(Gguf, RejectsHugeStringValueLength) {
  GgufBuilder b;
  std::string payload(8, '\0');
  const uint64_t len = uint64_t{1} << 63;
  std::memcpy(payload.data(), &len, 8);
  b.RawKv("general.name", 8, payload + "abc");
  ExpectError(b.Build(), "key 'general.name': string length");
}

TEST(Gguf, RejectsHugeArrayCount) {
  GgufBuilder b;
  std::string payload(12, '\0');
  const uint32_t et = 5;
  const uint64_t n = uint64_t{1} << 62;
  std::memcpy(payload.data(), &et, 4);
  std::memcpy(payload.data() + 4, &n, 8);
  b.RawKv("tokenizer.ggml.token_type", 9, payload);
  ExpectError(b.Build(), "key 'tokenizer.ggml.token_type': array of 4611686018427387904");
}

TEST(Gguf, RejectsUnknownValueType) {
  GgufBuilder b;
  b.RawKv("odd.key", 77, "xxxx");
  ExpectError(b.Build(), "key 'odd.key': unknown value type 77");
}

TEST(Gguf, RejectsOverflowingDims) {
  GgufBuilder b;
  b.Tensor("big", {uint64_t{1} << 32, uint64_t{1} << 32, uint64_t{1} << 32}, 0, "");
  ExpectError(b.Build(), "tensor 'big': element count overflows");
}

TEST(Gguf, RejectsTooManyDims) {
  GgufBuilder b;
  b.Tensor("five", {1, 1, 1, 1, 1}, 0, FloatBytes({1}));
  ExpectError(b.Build(), "tensor 'five': n_dims 5");
}

TEST(Gguf, RejectsZeroDim) {
  GgufBuilder b;
  b.Tensor("zero", {4, 0}, 0, "");
  ExpectError(b.Build(), "tensor 'zero': dim 1 = 0");
}

TEST(Gguf, RejectsOffsetPastEof) {
  GgufBuilder b;
  b.Tensor("far", {8}, 0, FloatBytes(std::vector<float>(8, 1)), uint64_t{1} << 40);
  ExpectError(b.Build(), "tensor 'far': data");
}

TEST(Gguf, RejectsMisalignedOffset) {
  GgufBuilder b;
  b.Tensor("skew", {8}, 0, FloatBytes(std::vector<float>(16, 1)), 4);
  ExpectError(b.Build(), "tensor 'skew': offset 4 is not aligned to 32");
}

TEST(Gguf, RejectsTruncatedData) {
  std::string bytes = Valid().Build();
  bytes.resize(bytes.size() - 16);
  ExpectError(bytes, "tensor 'v': data");
}

TEST(Gguf, RejectsTruncatedHeader) {
  std::string bytes = Valid().Build();
  bytes.resize(60);
  auto f = Parse(bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Gguf, RejectsUnknownTensorType) {
  GgufBuilder b;
  b.Tensor("t", {32}, 99, std::string(128, '\0'));
  ExpectError(b.Build(), "tensor 't': unsupported tensor type 99");
  GgufBuilder iq2;  // a ggml type kvmesh does not read, by its name
  iq2.Tensor("t", {256}, 16, std::string(66, '\0'));
  ExpectError(iq2.Build(), "tensor 't': unsupported tensor type IQ2_XXS");
}

TEST(Gguf, RejectsRowNotWholeBlocks) {
  GgufBuilder b;
  b.Tensor("q", {33, 2}, 2, std::string(64, '\0'));  // Q4_0 blocks are 32 wide
  ExpectError(b.Build(),
              "tensor 'q': row of 33 elements is not a multiple of the Q4_0 block size 32");
}

TEST(Gguf, RejectsDuplicateTensorName) {
  GgufBuilder b;
  b.Tensor("dup", {8}, 0, FloatBytes(std::vector<float>(8, 1)))
      .Tensor("dup", {8}, 0, FloatBytes(std::vector<float>(8, 1)));
  ExpectError(b.Build(), "duplicate tensor name 'dup'");
}

TEST(Gguf, RejectsDuplicateKey) {
  GgufBuilder b;
  b.U32("k", 1).U32("k", 2);
  ExpectError(b.Build(), "duplicate key 'k'");
}

TEST(Gguf, RejectsBadAlignment) {
  GgufBuilder b;
  b.U32("general.alignment", 3);
  ExpectError(b.Build(), "general.alignment");
}

TEST(Gguf, OpenReportsMissingAndNonGgufFiles) {
  auto missing = GgufFile::Open("/nonexistent/dir/model.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string path = ::testing::TempDir() + "/not_a_model.gguf";
  FILE* fp = std::fopen(path.c_str(), "wb");
  std::fputs("this is plain text, not a model file", fp);
  std::fclose(fp);
  auto bad = GgufFile::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("not a GGUF file"), std::string::npos);
}

TEST(Gguf, OpenMapsARealFile) {
  const std::string path = ::testing::TempDir() + "/small.gguf";
  const std::string bytes = Valid().Build();
  FILE* fp = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), fp);
  std::fclose(fp);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->file_size(), bytes.size());
  EXPECT_EQ((*f)->tensors().size(), 2u);
}

}  // namespace
}  // namespace kvmesh::model
