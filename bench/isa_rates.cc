// How fast this CPU issues the vector instructions the kernels are built on, per core: the
// arithmetic ceilings that decode at many sequences runs into (docs/shared-context.md).
//
//   build/bin/isa_rates [--seconds 0.5]
//
// Each instruction runs in 12 independent register chains (enough to cover its latency), in
// timed bursts, so the rate measured is the issue rate (the mixes at the end: 8 chains and 4
// other instructions, read against 8 chains beside a register move). Multiply-adds per instruction
// turn it into the peak of each kind of product: VPDPWSSD is the 16-bit-activation integer product
// (kernels/packed.h), VFMADD231PS the fp32 attention, VPDPBUSD and VDPBF16PS the cheaper-arithmetic
// alternatives. Then whether the CPUs are separate cores (VPDPWSSD on all of them at once, or the
// FMA without VNNI), and which other instructions take the units VPDPWSSD runs on. On AVX2
// machines, the 256-bit loops the AVX2 kernels are built of (no VNNI: a product is a multiply and
// an add), down to one step of the packed product and one dim of attention's q.k tile. On AMX
// machines, whether a tile block and the vector work beside it overlap (AmxSection).

// GCC 12's false (maybe-)uninitialized warnings in its AVX-512 intrinsics (bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/primitives.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBurst = 100000;  // loop iterations per timed burst

// Runs burst() until `seconds` have passed; returns bursts per second.
double BurstsPerSecond(double seconds, void (*burst)()) {
  int64_t n = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    burst();
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  return static_cast<double>(n) / elapsed;
}

// burst() on every CPU this process may run on at once, one thread pinned to each, started
// together: each CPU's bursts per second. Against one thread alone, ~1 each when the CPUs are
// separate cores, ~0.5 when two are hyperthreads of one core (they share its units). Empty if
// the affinity mask cannot be read or a thread cannot be pinned.
struct CpuRate {
  int cpu;
  double rate;
};
std::vector<CpuRate> OnEveryCpu(double seconds, void (*burst)()) {
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return {};
  std::vector<CpuRate> rates;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) rates.push_back({c, 0.0});
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, pinned{true};
  std::vector<std::thread> threads;
  for (CpuRate& r : rates) {
    threads.emplace_back([&, seconds, burst] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(r.cpu, &one);
      if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) pinned = false;
      ++ready;
      while (!go.load()) {
      }
      r.rate = BurstsPerSecond(seconds, burst);
    });
  }
  while (ready.load() < static_cast<int>(rates.size())) {
  }
  go = true;
  for (std::thread& t : threads) t.join();
  if (!pinned) return {};
  return rates;
}

// Keeps the chains' results alive past the loop.
template <typename V>
void Sink(V v) {
  __asm__ volatile("" : : "v"(v));
}

// A burst of kBurst x 12 `insn`s, one per chain: `insn b, a, acc` on zmm registers.
#define KVMESH_BURST(name, insn)                                                                  \
  __attribute__((target("avx512f,avx512vnni,avx512bf16"))) void name() {                          \
    __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.5f);                                 \
    __m512 s0 = a, s1 = a, s2 = a, s3 = a, s4 = a, s5 = a, s6 = a, s7 = a, s8 = a, s9 = a,        \
           s10 = a, s11 = a;                                                                      \
    for (int i = 0; i < kBurst; ++i) {                                                            \
      __asm__ volatile(insn                                                                       \
                       " %12, %13, %0\n\t" insn " %12, %13, %1\n\t" insn " %12, %13, %2\n\t" insn \
                       " %12, %13, %3\n\t" insn " %12, %13, %4\n\t" insn " %12, %13, %5\n\t" insn \
                       " %12, %13, %6\n\t" insn " %12, %13, %7\n\t" insn " %12, %13, %8\n\t" insn \
                       " %12, %13, %9\n\t" insn " %12, %13, %10\n\t" insn " %12, %13, %11"        \
                       : "+v"(s0), "+v"(s1), "+v"(s2), "+v"(s3), "+v"(s4), "+v"(s5), "+v"(s6),    \
                         "+v"(s7), "+v"(s8), "+v"(s9), "+v"(s10), "+v"(s11)                       \
                       : "v"(a), "v"(b));                                                         \
    }                                                                                             \
    Sink(_mm512_add_ps(_mm512_add_ps(s0, s11), s5));                                              \
  }

KVMESH_BURST(BurstDpwssd, "vpdpwssd")
KVMESH_BURST(BurstDpbusd, "vpdpbusd")
KVMESH_BURST(BurstFma, "vfmadd231ps")
KVMESH_BURST(BurstDpbf16, "vdpbf16ps")
#undef KVMESH_BURST

// VPDPWSSD with its activation pair broadcast from memory ({1to16}), as the packed kernel
// takes it.
__attribute__((target("avx512f,avx512vnni"))) void BurstDpwssdBroadcast() {
  alignas(64) static int32_t pairs[16] = {};
  const int32_t* p = pairs;
  __m512i w = _mm512_set1_epi16(3);
  __m512i s0 = w, s1 = w, s2 = w, s3 = w, s4 = w, s5 = w, s6 = w, s7 = w, s8 = w, s9 = w, s10 = w,
          s11 = w;
  for (int i = 0; i < kBurst; ++i) {
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
  Sink(_mm512_add_epi32(_mm512_add_epi32(s0, s11), s5));
}

// 8 VPDPWSSD chains and 4 of another instruction per iteration (`other` is the instruction up
// to its destination, which is one of 4 registers of its own): how many VPDPWSSD still issue per
// cycle tells whether the other one takes the same execution units. The kernels' fp32 scaling,
// conversions and unpacking run beside the integer products (the packed kernel) and the fused
// multiply-adds (attention); the units they share bound both.
#define KVMESH_MIX(name, other)                                                             \
  __attribute__((target("avx512f,avx512bw,avx512vnni,f16c"))) void name() {                 \
    __m512i a = _mm512_set1_epi16(3), b = _mm512_set1_epi16(5);                             \
    __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.5f);                           \
    __m512i i0 = a, i1 = a, i2 = a, i3 = a, i4 = a, i5 = a, i6 = a, i7 = a;                 \
    __m512 f0 = x, f1 = x, f2 = x, f3 = x;                                                  \
    for (int i = 0; i < kBurst; ++i) {                                                      \
      __asm__ volatile(                                                                     \
          "vpdpwssd %12, %13, %0\n\tvpdpwssd %12, %13, %1\n\tvpdpwssd %12, %13, "           \
          "%2\n\tvpdpwssd %12, %13, %3\n\t" other "%8\n\t" other                            \
          "%9\n\tvpdpwssd %12, %13, %4\n\tvpdpwssd %12, %13, %5\n\tvpdpwssd %12, "          \
          "%13, %6\n\tvpdpwssd %12, %13, %7\n\t" other "%10\n\t" other "%11"                \
          : "+v"(i0), "+v"(i1), "+v"(i2), "+v"(i3), "+v"(i4), "+v"(i5), "+v"(i6), "+v"(i7), \
            "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3)                                          \
          : "v"(a), "v"(b), "v"(x), "v"(y));                                                \
    }                                                                                       \
    Sink(_mm512_add_ps(_mm512_add_ps(f0, f3), _mm512_castsi512_ps(i0)));                    \
  }

KVMESH_MIX(MixNothing, "vmovaps %8, ")  // a register move: removed at rename, the baseline
KVMESH_MIX(MixFma, "vfmadd231ps %14, %15, ")
KVMESH_MIX(MixMul, "vmulps %14, %15, ")
KVMESH_MIX(MixAdd, "vaddps %14, %15, ")
KVMESH_MIX(MixMax, "vmaxps %14, %15, ")
KVMESH_MIX(MixCvtIntToFloat, "vcvtdq2ps %12, ")
KVMESH_MIX(MixCvtFloatToInt, "vcvtps2dq %14, ")
KVMESH_MIX(MixRound, "vrndscaleps $0, %14, ")
KVMESH_MIX(MixCvtHalf, "vcvtph2ps %t12, ")
KVMESH_MIX(MixZeroExtend, "vpmovzxbw %t12, ")
KVMESH_MIX(MixAnd, "vpandd %12, %13, ")
KVMESH_MIX(MixShift, "vpsrlw $4, %12, ")
#undef KVMESH_MIX

// The 256-bit (AVX2 + FMA + F16C) loops: what the AVX2 kernels are built of, on machines
// without VNNI, where an integer product is a multiply (VPMADDWD / VPMADDUBSW) and a separate add
// into the sums. Each is one timed loop over fixed registers (vzeroall clears ymm/zmm 0-15
// first); main's table says how many of the counted units (instructions, pairs or kernel steps)
// one iteration holds.
// clang-format off
#define KVMESH_LOOP(isa, name, body)                                              \
  __attribute__((target(isa))) void name() {                                      \
    alignas(64) static uint8_t buf[256] = {};                                     \
    const uint8_t* p = buf;                                                       \
    /* every register zero: no denormal or NaN operands (their timing may differ) */ \
    __asm__ volatile("vzeroall" : : : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",  \
                     "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",  \
                     "xmm14", "xmm15");                                           \
    for (int i = 0; i < kBurst; ++i) {                                            \
      __asm__ volatile(body : : [p] "r"(p)                                        \
                       : "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", \
                         "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",  \
                         "xmm13", "xmm14", "xmm15");                              \
    }                                                                             \
  }
#define KVMESH_AVX2_LOOP(name, body) KVMESH_LOOP("avx2,fma,f16c", name, body)

// 12 VFMADD231PS chains.
#define KVMESH_F(r) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
KVMESH_AVX2_LOOP(Avx2Fma, KVMESH_F(0) KVMESH_F(1) KVMESH_F(2) KVMESH_F(3) KVMESH_F(4) KVMESH_F(5)
                          KVMESH_F(6) KVMESH_F(7) KVMESH_F(8) KVMESH_F(9) KVMESH_F(10) KVMESH_F(11))
#undef KVMESH_F

// 8 chains of a VPMADDWD into a temporary and a VPADDD of it into the sums (16 int16
// multiply-adds per pair: the 16-bit-activation product without VNNI).
#define KVMESH_W(t, r) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #t "\n\t" \
                       "vpaddd %%ymm" #t ", %%ymm" #r ", %%ymm" #r "\n\t"
KVMESH_AVX2_LOOP(Avx2MaddwdAdd, KVMESH_W(8, 0) KVMESH_W(9, 1) KVMESH_W(10, 2) KVMESH_W(11, 3)
                                KVMESH_W(12, 4) KVMESH_W(13, 5) KVMESH_W(8, 6) KVMESH_W(9, 7))

// The same with VPMADDUBSW and VPADDW (32 multiply-adds per pair: the 8-bit product).
#define KVMESH_B(t, r) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n\t" \
                       "vpaddw %%ymm" #t ", %%ymm" #r ", %%ymm" #r "\n\t"
KVMESH_AVX2_LOOP(Avx2MaddubswAdd, KVMESH_B(8, 0) KVMESH_B(9, 1) KVMESH_B(10, 2) KVMESH_B(11, 3)
                                  KVMESH_B(12, 4) KVMESH_B(13, 5) KVMESH_B(8, 6) KVMESH_B(9, 7))
#undef KVMESH_B

// 4 VPMADDWD + VPADDD pairs and 4 VFMADD231PS per iteration: were they on separate units, an
// iteration would cost the larger of the two parts; it costs about their sum.
#define KVMESH_FMA(r) "vfmadd231ps %%ymm12, %%ymm13, %%ymm" #r "\n\t"
KVMESH_AVX2_LOOP(Avx2MaddwdBesideFma, KVMESH_W(8, 0) KVMESH_FMA(4) KVMESH_W(9, 1) KVMESH_FMA(5)
                                      KVMESH_W(10, 2) KVMESH_FMA(6) KVMESH_W(11, 3) KVMESH_FMA(7))
#undef KVMESH_FMA
#undef KVMESH_W

// One step of the AVX2 16-bit packed kernel (primitives_avx2_packed.cc PackedGroup4: 4 elements
// of 16 weight rows against 4 tokens, 256 multiply-adds): 16 bytes of nibbles zero-extended from
// memory and split, then per token two broadcast activation pairs, each into two VPMADDWD +
// VPADDD.
#define KVMESH_UNPACK "vpmovzxbw 128(%[p]), %%ymm10\n\tvpmovzxbw 144(%[p]), %%ymm11\n\t"    \
                      "vpand %%ymm15, %%ymm10, %%ymm8\n\tvpsrlw $4, %%ymm10, %%ymm10\n\t"   \
                      "vpand %%ymm15, %%ymm11, %%ymm9\n\tvpsrlw $4, %%ymm11, %%ymm11\n\t"
#define KVMESH_PAIR(off, w0, w1, s0, s1)                                    \
  "vpbroadcastd " off "(%[p]), %%ymm12\n\t"                                 \
  "vpmaddwd %%ymm12, %%ymm" #w0 ", %%ymm13\n\t"                             \
  "vpaddd %%ymm13, %%ymm" #s0 ", %%ymm" #s0 "\n\t"                          \
  "vpmaddwd %%ymm12, %%ymm" #w1 ", %%ymm12\n\t"                             \
  "vpaddd %%ymm12, %%ymm" #s1 ", %%ymm" #s1 "\n\t"
#define KVMESH_TOKEN(off, s0, s1) KVMESH_PAIR(#off, 8, 9, s0, s1) \
                                  KVMESH_PAIR("4+" #off, 10, 11, s0, s1)
KVMESH_AVX2_LOOP(Avx2PackedStep, KVMESH_UNPACK KVMESH_TOKEN(0, 0, 4) KVMESH_TOKEN(32, 1, 5)
                                 KVMESH_TOKEN(64, 2, 6) KVMESH_TOKEN(96, 3, 7))
#undef KVMESH_TOKEN
#undef KVMESH_PAIR
#undef KVMESH_UNPACK

// One dim of attention's q.k tile, as the compiler emits it (primitives_avx2.cc QkTile<3, 4>: 3
// query heads x 32 keys in ymm; primitives_avx512.cc QkTile<3, 4>: 3 x 64 keys in zmm): the 3
// heads' query values broadcast, then 4 vectors of fp16 keys converted from memory, each into 3
// fused multiply-adds (12). Beside the plain FMA chains' rate it says whether the mix itself
// bounds the kernel's inner loop.
#define KVMESH_BCAST(r) "vbroadcastss 192(%[p]), %%" r "0\n\tvbroadcastss 196(%[p]), %%" r "1\n\t" \
                        "vbroadcastss 200(%[p]), %%" r "2\n\t"
#define KVMESH_KEYS(r, off, a, b, c) "vcvtph2ps " #off "(%[p]), %%" r "3\n\t"     \
                                     "vfmadd231ps %%" r "3, %%" r "0, %%" r #a "\n\t" \
                                     "vfmadd231ps %%" r "3, %%" r "1, %%" r #b "\n\t" \
                                     "vfmadd231ps %%" r "3, %%" r "2, %%" r #c "\n\t"
KVMESH_AVX2_LOOP(Avx2QkTileDim, KVMESH_BCAST("ymm") KVMESH_KEYS("ymm", 0, 4, 5, 6)
                                KVMESH_KEYS("ymm", 16, 7, 8, 9) KVMESH_KEYS("ymm", 32, 10, 11, 12)
                                KVMESH_KEYS("ymm", 48, 13, 14, 15))
KVMESH_LOOP("avx512f", Avx512QkTileDim, KVMESH_BCAST("zmm") KVMESH_KEYS("zmm", 0, 4, 5, 6)
                                        KVMESH_KEYS("zmm", 32, 7, 8, 9)
                                        KVMESH_KEYS("zmm", 64, 10, 11, 12)
                                        KVMESH_KEYS("zmm", 96, 13, 14, 15))
#undef KVMESH_KEYS
#undef KVMESH_BCAST
#undef KVMESH_AVX2_LOOP
#undef KVMESH_LOOP
// clang-format on

// A chain of 4 x 10 x kBurst dependent integer adds (one per cycle): the clock rate. The addend
// is a register: Intel's Golden Cove cores (the 22nd-27th sessions' Xeon) execute adds of an
// immediate at rename, and a chain of those read 10-11 "GHz" there, a third of every per-cycle
// rate below (register adds 3.1 G/s against 1.1 G/s of 3-cycle IMULs, twenty-seventh session).
void BurstAdds() {
  int64_t x = 0;
  const int64_t one = 1;
  for (int i = 0; i < 10 * kBurst; ++i) {
    __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
  }
}

// AMX: one block of the 16-token tile pass (kernels/cpu/primitives_amx.cc) -- the A tiles of
// the activations' low and high bytes (16 x 32 bytes), B (8 x 64), two products into one pair
// of C tiles, the other pair (the block before) stored -- and the vector work that scales a
// block's sums for 16 tokens (two loads, a shift, an add, a conversion, a multiply and a fused
// multiply-add each), here reading a buffer no tile writes so that it waits on nothing the tiles
// do. Each alone, then interleaved block by block: a core that ran them side by side would take
// about the longer of the two, one that cannot would take their sum.
#define KVMESH_AMX __attribute__((target("avx512f,avx512bw,amx-tile,amx-int8")))
constexpr int kAmxBlocks = 4096;  // blocks per timed burst
constexpr int kAmxK = 18;         // blocks per activation row (576 elements)
struct alignas(64) AmxScratch {
  uint8_t a[16][64 * kAmxK];  // 16 tokens' split rows
  uint8_t b[8][64];
  int32_t c[2][2][16][16];  // [parity][lo, hi][token][row], stored by the tiles
  int32_t sums[2][16][16];  // what the vector work reads
};
AmxScratch g_amx;

struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

KVMESH_AMX void AmxConfigure() {
  AmxConfig c;
  c.colsb[0] = c.colsb[1] = c.colsb[5] = c.colsb[6] = 64;  // C: 16 tokens x 16 int32
  c.rows[0] = c.rows[1] = c.rows[5] = c.rows[6] = 16;
  c.colsb[2] = c.colsb[3] = 32;  // A: 16 tokens x 32 bytes
  c.rows[2] = c.rows[3] = 16;
  c.colsb[4] = 64;  // B: 8 x 64 bytes
  c.rows[4] = 8;
  // GCC 12's _tile_loadconfig tells the compiler it reads only the record's first 8 bytes.
  __asm__ volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
}

// A block's two products into C tiles lo / hi, and the other pair's (the block before) stores.
// A macro: the tile intrinsics paste their tile number into the instruction's text.
#define KVMESH_AMX_PRODUCTS(lo, hi, store_lo, store_hi, c) \
  _tile_zero(lo);                                          \
  _tile_zero(hi);                                          \
  _tile_dpbuud(lo, 2, 4);                                  \
  _tile_dpbsud(hi, 3, 4);                                  \
  _tile_stored(store_lo, &(c)[0][0][0], 64);               \
  _tile_stored(store_hi, &(c)[1][0][0], 64)

template <bool kTiles, bool kVector>
KVMESH_AMX void AmxBurst() {
  AmxScratch& s = g_amx;
  __m512 acc[16];
  for (auto& x : acc) x = _mm512_setzero_ps();
  const __m512 d = _mm512_set1_ps(0.5f), dw = _mm512_set1_ps(0.25f);
  for (int i = 0; i < kAmxBlocks; ++i) {
    if constexpr (kTiles) {
      const int k = i % kAmxK;
      _tile_loadd(2, &s.a[0][64 * k], 64 * kAmxK);
      _tile_loadd(3, &s.a[0][64 * k + 32], 64 * kAmxK);
      _tile_loadd(4, &s.b[0][0], 64);
      if (i & 1) {
        KVMESH_AMX_PRODUCTS(5, 6, 0, 1, s.c[0]);
      } else {
        KVMESH_AMX_PRODUCTS(0, 1, 5, 6, s.c[1]);
      }
    }
    if constexpr (kVector) {
      __asm__ volatile("" : : : "memory");  // the sums are read anew each block
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) {
        const __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(s.sums[1][t]), 8),
                                           _mm512_load_si512(s.sums[0][t]));
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), d), dw, acc[t]);
      }
    }
  }
  __m512 sum = acc[0];
  for (int t = 1; t < 16; ++t) sum = _mm512_add_ps(sum, acc[t]);
  Sink(sum);
}

// Prints the three rates; false where the kernels would not use AMX (cpu::AmxUsable).
KVMESH_AMX bool AmxSection(double seconds) {
  if (!kvmesh::kernels::cpu::AmxUsable()) return false;  // the kernels' check and OS request
  for (int t = 0; t < 16; ++t) {
    for (int j = 0; j < 64 * kAmxK; ++j) g_amx.a[t][j] = static_cast<uint8_t>(t * 31 + j);
    for (int r = 0; r < 16; ++r) g_amx.sums[0][t][r] = g_amx.sums[1][t][r] = t + r;
  }
  for (int p = 0; p < 8; ++p) {
    for (int j = 0; j < 64; ++j) g_amx.b[p][j] = static_cast<uint8_t>((p + j) & 15);
  }
  AmxConfigure();
  const auto ns = [&](void (*burst)()) {
    return 1e9 / (BurstsPerSecond(seconds, burst) * kAmxBlocks);
  };
  const double tiles = ns(AmxBurst<true, false>), vector = ns(AmxBurst<false, true>),
               both = ns(AmxBurst<true, true>);
  _tile_release();
  std::printf(
      "\nAMX, one block of the 16-token tile pass (ns): tiles %.1f, the scaling's vector work "
      "%.1f,\nboth interleaved %.1f (side by side would be ~%.1f, one after the other %.1f)\n",
      tiles, vector, both, std::max(tiles, vector), tiles + vector);
  return true;
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
  const double hz = BurstsPerSecond(seconds, BurstAdds) * 40.0 * kBurst;
  std::printf("clock (dependent adds): %.2f GHz; one thread\n512-bit registers:\n", hz / 1e9);
  std::printf("%-17s %14s %12s %14s %22s\n", "instruction", "G instr/s", "per cycle",
              "MACs / instr", "G multiply-adds / s");
  struct Row {
    const char* name;
    bool ok;
    void (*burst)();
    int macs;
  };
  const Row rows[] = {{"vpdpwssd", vnni, BurstDpwssd, 32},
                      {"vpdpwssd m32bcst", vnni, BurstDpwssdBroadcast, 32},
                      {"vpdpbusd", vnni, BurstDpbusd, 64},
                      {"vfmadd231ps", avx512, BurstFma, 16},
                      {"vdpbf16ps", bf16, BurstDpbf16, 32}};
  for (const Row& r : rows) {
    if (!r.ok) {
      std::printf("%-17s %14s\n", r.name, "not supported by this CPU");
      continue;
    }
    const double ips = BurstsPerSecond(seconds, r.burst) * 12.0 * kBurst;
    std::printf("%-17s %14.2f %12.2f %14d %22.1f\n", r.name, ips / 1e9, ips / hz, r.macs,
                ips * r.macs / 1e9);
  }
  if (avx512) {
    // Whether the CPUs are separate cores: the product's instruction on all of them at once.
    const Row& r = vnni ? rows[0] : rows[3];
    const double alone = BurstsPerSecond(seconds, r.burst);
    const std::vector<CpuRate> all = OnEveryCpu(seconds, r.burst);
    if (all.size() > 1) {
      std::printf(
          "\n%s on all %zu CPUs at once, one pinned thread each, per CPU as a share of one\n"
          "thread alone (~1: separate cores; ~0.5: hyperthreads sharing a core):",
          r.name, all.size());
      for (const CpuRate& c : all) std::printf(" cpu%d %.2f", c.cpu, c.rate / alone);
      std::printf("\n");
    }
  }
  if (vnni && __builtin_cpu_supports("avx512bw")) {
    std::printf(
        "\n8 vpdpwssd chains + 4 of another instruction per iteration: vpdpwssd per cycle (1.33\n"
        "if the other takes one of the two multiply units every time: 12 on two units per 8\n"
        "vpdpwssd), and as a share of the rate beside a register move (~1: other units):\n");
    const struct {
      const char* name;
      void (*burst)();
    } mixes[] = {{"nothing (a move)", MixNothing},
                 {"vfmadd231ps", MixFma},
                 {"vmulps", MixMul},
                 {"vaddps", MixAdd},
                 {"vmaxps", MixMax},
                 {"vcvtdq2ps", MixCvtIntToFloat},
                 {"vcvtps2dq", MixCvtFloatToInt},
                 {"vrndscaleps", MixRound},
                 {"vcvtph2ps", MixCvtHalf},
                 {"vpmovzxbw", MixZeroExtend},
                 {"vpandd", MixAnd},
                 {"vpsrlw", MixShift}};
    double alone = 0;
    for (const auto& m : mixes) {
      const double per_cycle = BurstsPerSecond(seconds, m.burst) * 8.0 * kBurst / hz;
      if (alone == 0) alone = per_cycle;
      std::printf("  + %-17s %5.2f  %4.2f\n", m.name, per_cycle, per_cycle / alone);
    }
  }
  if (avx512) {
    // 12 fused multiply-adds per iteration; 2 per cycle is the FMA units' ceiling.
    const double fmas = BurstsPerSecond(seconds, Avx512QkTileDim) * 12.0 * kBurst / hz;
    std::printf("\nq.k tile dim, 512-bit (3 vbroadcastss, 4 vcvtph2ps, 12 FMA): %.2f FMA / cycle\n",
                fmas);
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    std::printf(
        "\n256-bit loops (the AVX2 kernels; products without VNNI are a multiply and an add):\n");
    std::printf("%-44s %12s %14s %20s\n", "loop", "per cycle", "MACs / unit",
                "multiply-adds / cycle");
    const struct {
      const char* name;
      void (*burst)();
      int per;   // counted units per iteration
      int macs;  // multiply-adds per unit
    } loops[] = {
        {"vfmadd231ps (12 chains)", Avx2Fma, 12, 8},
        {"vpmaddwd + vpaddd pair (8 chains)", Avx2MaddwdAdd, 8, 16},
        {"vpmaddubsw + vpaddw pair (8 chains)", Avx2MaddubswAdd, 8, 32},
        {"4 vpmaddwd+vpaddd pairs + 4 vfmadd231ps", Avx2MaddwdBesideFma, 1, 96},
        {"packed 16-bit step (16 rows x 4 el. x 4 tok.)", Avx2PackedStep, 1, 256},
        {"q.k tile dim (3 bcast, 4 vcvtph2ps, 12 FMA)", Avx2QkTileDim, 1, 96},
    };
    for (const auto& l : loops) {
      const double per_cycle = BurstsPerSecond(seconds, l.burst) * l.per * kBurst / hz;
      std::printf("%-44s %12.3f %14d %20.1f\n", l.name, per_cycle, l.macs, per_cycle * l.macs);
    }
  }
  if (!AmxSection(seconds)) std::printf("\nAMX: not on this CPU, or the OS gave no tile state\n");
  return 0;
}
