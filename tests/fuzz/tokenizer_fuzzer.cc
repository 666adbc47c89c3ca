// libFuzzer target: arbitrary bytes through the tokenizer of the real model (or, when it is not
// available, a small byte-level vocabulary). Checks the round trip: decoding the ids gives back
// the input, less only bytes the vocabulary has no token for.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

std::unique_ptr<kvmesh::model::GgufFile> g_gguf;
std::unique_ptr<kvmesh::model::Tokenizer> g_tok;
bool g_has_byte[256];

std::string ModelPath() {
  if (const char* m = std::getenv("KVMESH_MODEL")) return m;
  const char* c = std::getenv("KVMESH_CACHE");
  const char* h = std::getenv("HOME");
  return (c ? std::string(c) : std::string(h ? h : ".") + "/.cache/kvmesh") +
         "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto f = kvmesh::model::GgufFile::Open(ModelPath());
  if (!f.ok()) {
    std::fprintf(stderr, "tokenizer_fuzzer: %s\n", std::string(f.status().message()).c_str());
    std::abort();
  }
  g_gguf = std::move(*f);
  auto t = kvmesh::model::Tokenizer::FromGguf(*g_gguf);
  if (!t.ok()) std::abort();
  g_tok = std::move(*t);
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    g_has_byte[b] = g_tok->Decode(g_tok->Encode(s, false)) == s;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::string want;
  for (unsigned char c : in) {
    if (g_has_byte[c]) want.push_back(static_cast<char>(c));
  }
  const auto plain = g_tok->Encode(in, /*parse_special=*/false);
  if (g_tok->Decode(plain) != want) std::abort();
  const auto special = g_tok->Encode(in, /*parse_special=*/true);
  if (g_tok->Decode(special, /*special=*/true) != want) std::abort();
  for (int32_t id : special) {
    if (id < 0 || id >= g_tok->vocab_size()) std::abort();
  }
  return 0;
}
