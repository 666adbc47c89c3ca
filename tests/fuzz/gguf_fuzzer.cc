// libFuzzer target: arbitrary bytes through the GGUF reader, then through everything that reads
// a parsed file (typed getters, tensor data, the Llama loader, the tokenizer). Any crash,
// sanitizer report or huge allocation is a bug; errors are expected.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

using kvmesh::model::GgufFile;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = GgufFile::FromBytes(std::span<const uint8_t>(data, size));
  if (!f.ok()) return 0;
  const GgufFile& g = **f;
  for (const std::string& k : g.keys()) {
    (void)g.GetUint(k);
    (void)g.GetInt(k);
    (void)g.GetFloat(k);
    (void)g.GetBool(k);
    (void)g.GetString(k);
    (void)g.GetStringArray(k);
    (void)g.GetIntArray(k);
  }
  volatile uint8_t sink = 0;
  for (const auto& t : g.tensors()) {
    const uint8_t* p = g.TensorData(t);
    if (t.n_bytes > 0) sink = sink + p[0] + p[t.n_bytes - 1];  // must lie inside the input
  }
  (void)kvmesh::model::Tokenizer::FromGguf(g);
  auto copy = GgufFile::FromBytes(std::span<const uint8_t>(data, size));
  if (copy.ok()) (void)kvmesh::model::LlamaModel::FromGguf(std::move(*copy));
  return 0;
}
