#include "kernels/isa.h"

#include <cstdlib>
#include <cstring>

namespace kvmesh::kernels {

namespace {
Isa Detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kScalar;
}

Isa Initial() {
  const Isa best = Detect();
  if (const char* env = std::getenv("KVMESH_ISA")) {
    if (std::strcmp(env, "scalar") == 0) return Isa::kScalar;
  }
  return best;
}

Isa g_isa = Initial();
}  // namespace

Isa DetectedIsa() { return Detect(); }
Isa ActiveIsa() { return g_isa; }

bool SetIsa(Isa isa) {
  if (isa == Isa::kAvx2 && Detect() != Isa::kAvx2) return false;
  g_isa = isa;
  return true;
}

std::string_view IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "scalar"; }

}  // namespace kvmesh::kernels
