// How fast this CPU issues the vector instructions the kernels are built on, per core: the
// arithmetic ceilings that decode at many sequences runs into (docs/shared-context.md).
//
//   build/bin/isa_rates [--seconds 0.5]
//
// Each instruction runs in 12 independent register chains (enough to cover its latency), so the
// rate measured is the issue rate. Multiply-adds per instruction turn it into the peak of each
// kind of product: VPDPWSSD is the 16-bit-activation integer product (kernels/packed.h),
// VFMADD231PS the fp32 attention, VPDPBUSD and VDPBF16PS the cheaper-arithmetic alternatives.
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

// 12 chains of one instruction `op acc, a, b` on zmm registers; returns instructions per second.
#define KVMESH_RATE_LOOP(name, insn)                                                          \
  __attribute__((target("avx512f,avx512vnni,avx512bf16"))) double name(double seconds) {      \
    __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.5f);                             \
    __m512 s0 = a, s1 = a, s2 = a, s3 = a, s4 = a, s5 = a, s6 = a, s7 = a, s8 = a, s9 = a,    \
           s10 = a, s11 = a;                                                                  \
    int64_t n = 0;                                                                            \
    const auto t0 = Clock::now();                                                             \
    double elapsed = 0;                                                                       \
    do {                                                                                      \
      for (int i = 0; i < 100000; ++i) {                                                      \
        __asm__ volatile(                                                                     \
            insn " %12, %13, %0\n\t" insn " %12, %13, %1\n\t" insn " %12, %13, %2\n\t" insn   \
                 " %12, %13, %3\n\t" insn " %12, %13, %4\n\t" insn " %12, %13, %5\n\t" insn   \
                 " %12, %13, %6\n\t" insn " %12, %13, %7\n\t" insn " %12, %13, %8\n\t" insn   \
                 " %12, %13, %9\n\t" insn " %12, %13, %10\n\t" insn " %12, %13, %11"          \
            : "+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3), "+v"(s4), "+v"(s5), "+v"(s6), "+v"(s7), \
              "+v"(s8), "+v"(s9), "+v"(s10), "+v"(s11)                                        \
            : "v"(a), "v"(b));                                                                \
      }                                                                                       \
      n += 100000 * 12;                                                                       \
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();                     \
    } while (elapsed < seconds);                                                              \
    float sink[16];                                                                           \
    _mm512_storeu_ps(sink, _mm512_add_ps(_mm512_add_ps(s0, s11), s5));                        \
    __asm__ volatile("" : : "r"(sink) : "memory");                                            \
    return static_cast<double>(n) / elapsed;                                                  \
  }

KVMESH_RATE_LOOP(RateDpwssd, "vpdpwssd")

// VPDPWSSD with its activation pair broadcast from memory ({1to16}), as the packed kernel
// takes it.
__attribute__((target("avx512f,avx512vnni"))) double RateDpwssdBroadcast(double seconds) {
  alignas(64) static int32_t pairs[16] = {};
  const int32_t* p = pairs;
  __m512i w = _mm512_set1_epi16(3);
  __m512i s0 = w, s1 = w, s2 = w, s3 = w, s4 = w, s5 = w, s6 = w, s7 = w, s8 = w, s9 = w, s10 = w,
          s11 = w;
  int64_t n = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 100000; ++i) {
#define KVMESH_BC(k) "vpdpwssd " #k "*4(%[p])%{1to16%}, %[w], %[s" #k "]\n\t"
      __asm__ volatile(KVMESH_BC(0) KVMESH_BC(1) KVMESH_BC(2) KVMESH_BC(3) KVMESH_BC(4) KVMESH_BC(5)
                           KVMESH_BC(6) KVMESH_BC(7) KVMESH_BC(8) KVMESH_BC(9) KVMESH_BC(10)
                               KVMESH_BC(11)
                       : [s0] "+v"(s0), [s1] "+v"(s1), [s2] "+v"(s2), [s3] "+v"(s3), [s4] "+v"(s4),
                         [s5] "+v"(s5), [s6] "+v"(s6), [s7] "+v"(s7), [s8] "+v"(s8), [s9] "+v"(s9),
                         [s10] "+v"(s10), [s11] "+v"(s11)
                       : [p] "r"(p), [w] "v"(w)
                       : "memory");
#undef KVMESH_BC
    }
    n += 100000 * 12;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  int32_t sink[16];
  _mm512_storeu_si512(sink, _mm512_add_epi32(_mm512_add_epi32(s0, s11), s5));
  __asm__ volatile("" : : "r"(sink) : "memory");
  return static_cast<double>(n) / elapsed;
}
KVMESH_RATE_LOOP(RateDpbusd, "vpdpbusd")
KVMESH_RATE_LOOP(RateFma, "vfmadd231ps")
KVMESH_RATE_LOOP(RateDpbf16, "vdpbf16ps")
#undef KVMESH_RATE_LOOP

// 8 VPDPWSSD and 4 VFMADD231PS chains interleaved: whether the two share execution units (the
// packed kernel's per-block scaling is fp32 multiplies and fused multiply-adds). Returns
// VPDPWSSD per second.
__attribute__((target("avx512f,avx512vnni"))) double RateDpwssdWithFma(double seconds) {
  __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(5);
  __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.5f);
  __m512i i0 = a, i1 = a, i2 = a, i3 = a, i4 = a, i5 = a, i6 = a, i7 = a;
  __m512 f0 = x, f1 = x, f2 = x, f3 = x;
  int64_t n = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 100000; ++i) {
      __asm__ volatile(
          "vpdpwssd %12, %13, %0\n\tvpdpwssd %12, %13, %1\n\tvpdpwssd %12, %13, %2\n\t"
          "vpdpwssd %12, %13, %3\n\tvfmadd231ps %14, %15, %8\n\tvfmadd231ps %14, %15, %9\n\t"
          "vpdpwssd %12, %13, %4\n\tvpdpwssd %12, %13, %5\n\tvpdpwssd %12, %13, %6\n\t"
          "vpdpwssd %12, %13, %7\n\tvfmadd231ps %14, %15, %10\n\tvfmadd231ps %14, %15, %11"
          : "+v"(i0), "+v"(i1), "+v"(i2), "+v"(i3), "+v"(i4), "+v"(i5), "+v"(i6), "+v"(i7),
            "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3)
          : "v"(a), "v"(b), "v"(x), "v"(y));
    }
    n += 100000 * 8;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  float sink[16];
  _mm512_storeu_ps(sink, _mm512_add_ps(_mm512_add_ps(f0, f3), _mm512_castsi512_ps(i0)));
  __asm__ volatile("" : : "r"(sink) : "memory");
  return static_cast<double>(n) / elapsed;
}

// Clock rate from a chain of dependent integer adds (one per cycle).
double ClockHz(double seconds) {
  int64_t x = 0, n = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 1000000; ++i) {
      __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    }
    n += 4000000;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  return static_cast<double>(n) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "isa_rates: unknown argument '%s' (usage: isa_rates [--seconds S])\n",
                   argv[i]);
      return 2;
    }
  }
  if (!(seconds > 0)) {
    std::fprintf(stderr, "isa_rates: --seconds must be positive\n");
    return 2;
  }
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool vnni = __builtin_cpu_supports("avx512vnni");
  const bool bf16 = __builtin_cpu_supports("avx512bf16");
  const double hz = ClockHz(seconds);
  std::printf("clock (dependent adds): %.2f GHz; one thread, 512-bit registers\n", hz / 1e9);
  std::printf("%-17s %14s %12s %14s %22s\n", "instruction", "G instr/s", "per cycle",
              "MACs / instr", "G multiply-adds / s");
  struct Row {
    const char* name;
    bool ok;
    double (*rate)(double);
    int macs;
  };
  const Row rows[] = {{"vpdpwssd", vnni, RateDpwssd, 32},
                      {"vpdpwssd m32bcst", vnni, RateDpwssdBroadcast, 32},
                      {"vpdpbusd", vnni, RateDpbusd, 64},
                      {"vfmadd231ps", avx512, RateFma, 16},
                      {"vdpbf16ps", bf16, RateDpbf16, 32}};
  for (const Row& r : rows) {
    if (!r.ok) {
      std::printf("%-17s %14s\n", r.name, "not supported by this CPU");
      continue;
    }
    const double ips = r.rate(seconds);
    std::printf("%-17s %14.2f %12.2f %14d %22.1f\n", r.name, ips / 1e9, ips / hz, r.macs,
                ips * r.macs / 1e9);
  }
  if (vnni) {
    const double ips = RateDpwssdWithFma(seconds);
    std::printf(
        "8 vpdpwssd + 4 vfmadd231ps interleaved: %.2f vpdpwssd per cycle (%.2f "
        "instructions per cycle in all)\n",
        ips / hz, 1.5 * ips / hz);
  }
  return 0;
}
