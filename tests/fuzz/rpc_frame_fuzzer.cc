// libFuzzer target: a connection's bytes as the RPC server reads them, fed to the frame decoder
// in two pieces; every decoded frame is re-encoded and must decode to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/rpc_frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvmesh::server::FrameDecoder d(1 << 16);
  const size_t cut = size > 0 ? data[0] % (size + 1) : 0;
  d.Feed(reinterpret_cast<const char*>(data), cut);
  d.Feed(reinterpret_cast<const char*>(data) + cut, size - cut);
  for (;;) {
    auto f = d.Next();
    if (!f.ok() || !f->has_value()) break;
    const std::string again = kvmesh::server::EncodeFrame(**f);
    kvmesh::server::FrameDecoder e(1 << 20);
    e.Feed(again.data(), again.size());
    auto g = e.Next();
    if (!g.ok() || !g->has_value() || (*g)->SerializeAsString() != (*f)->SerializeAsString()) {
      std::abort();
    }
  }
  return 0;
}
