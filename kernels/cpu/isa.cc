#include "kernels/isa.h"

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/primitives.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace kvmesh::kernels {

namespace {
Isa Detect() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::kScalar;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!(fma && osxsave && avx && f16c)) return Isa::kScalar;
  // The OS must save the YMM registers (XCR0 bits 1 and 2).
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return Isa::kScalar;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::kScalar;
  if (!(b & (1u << 5))) return Isa::kScalar;
  // AVX-512 F (EBX 16), DQ (17), BW (30), VL (31), VNNI (ECX 11).
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) &&
                      (b & (1u << 31)) && (c & (1u << 11));
  // ... and the OS must save the opmask and ZMM state (XCR0 bits 5..7).
  if (avx512 && (xcr0_lo & 0xE0u) == 0xE0u) return cpu::AmxUsable() ? Isa::kAmx : Isa::kAvx512;
  return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

int Level(Isa i) { return static_cast<int>(i); }

Isa Initial() {
  const Isa best = Detect();
  if (const char* env = std::getenv("KVMESH_ISA")) {
    for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      if (IsaName(i) == env && Level(i) <= Level(best)) return i;
    }
  }
  return best;
}

Isa g_isa = Initial();
}  // namespace

Isa DetectedIsa() { return Detect(); }
Isa ActiveIsa() { return g_isa; }

bool SetIsa(Isa isa) {
  if (Level(isa) > Level(Detect())) return false;
  g_isa = isa;
  return true;
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAmx:
      return "amx";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

}  // namespace kvmesh::kernels
