// Internal: the vector primitives under the CPU kernels (dot products, tiled products,
// activation quantisation, exp), as a table per ISA: scalar, AVX2, AVX-512. nb counts
// 32-element blocks; n counts elements.
#pragma once

#include <cstdint>

#include "kernels/quant.h"

namespace kvmesh::kernels::cpu {

struct Primitives {
  // Weight blocks x against activation blocks y (see BlockA16).
  float (*q4_0_a16)(const BlockQ4_0* x, const BlockA16* y, int64_t nb);
  float (*q4_1_a16)(const BlockQ4_1* x, const BlockA16* y, int64_t nb);
  float (*q8_0_a16)(const BlockQ8_0* x, const BlockA16* y, int64_t nb);
  // K-quant super-blocks (256 elements = 8 activation blocks); nb still counts 32-element
  // activation blocks (a multiple of 8).
  float (*q4_k_a16)(const BlockQ4_K* x, const BlockA16* y, int64_t nb);
  float (*q6_k_a16)(const BlockQ6_K* x, const BlockA16* y, int64_t nb);
  float (*f32_f32)(const float* x, const float* y, int64_t n);
  // Register-tiled products for prefill: out[t * ldo + r] = dot(row r, token t) for 4 rows
  // (w + r * w_stride bytes) and 4 tokens (a + t * a_stride blocks). Null where the ISA has
  // no tiled kernel; callers then use the single dots.
  using Tile4x4 = void (*)(const uint8_t* w, size_t w_stride, const BlockA16* a, int64_t a_stride,
                           int64_t nb, float* out, int64_t ldo);
  Tile4x4 q4_0_tile = nullptr, q4_1_tile = nullptr, q8_0_tile = nullptr;
  // QuantizeRowA16 (round half to even; the scalar reference rounds the same way).
  void (*quantize_a16)(const float* x, BlockA16* y, int64_t n) = nullptr;
  // y[i] = exp(x[i] - shift) (relative error < 2e-7 for arguments in [-87, 88]).
  void (*exp_shifted)(const float* x, float shift, float* y, int64_t n) = nullptr;
  // out[i] = silu(gate[i]) * up[i].
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  // Attention over a chunk of n keys for the G query heads sharing one KV head (head dim d),
  // with the chunk's K and V staged as fp32 rows [n, d]:
  //   qk: scores[g * ss + j] = scale * dot(q + g * d, k + j * d)
  //   pv: o[g * os + i] += sum_j p[g * ps + j] * (v + j * d)[i]
  void (*qk)(const float* q, int64_t G, int64_t d, const float* k, int64_t n, float scale,
             float* scores, int64_t ss) = nullptr;
  void (*pv)(const float* p, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n, float* o,
             int64_t os) = nullptr;
  // The same over fp16 rows in place (row j at rows[j]): bit-identical to staging them with
  // f16_to_f32 and calling qk / pv (used where nothing would share the staged rows).
  void (*qk_f16)(const float* q, int64_t G, int64_t d, const uint16_t* const* rows, int64_t n,
                 float scale, float* scores, int64_t ss) = nullptr;
  void (*pv_f16)(const float* p, int64_t ps, int64_t G, int64_t d, const uint16_t* const* rows,
                 int64_t n, float* o, int64_t os) = nullptr;
  // dst[i] = float(fp16 src[i]) (exact).
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  // dst[i] = fp16(src[i]), round to nearest even.
  void (*to_fp16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
};

const Primitives& ScalarPrimitives();
const Primitives& Avx2Primitives();
const Primitives& Avx512Primitives();
// The table of the active ISA.
const Primitives& Prims();

// ISA-independent qk / pv built from f32_f32 of `p` and plain loops.
void GenericQk(const Primitives& p, const float* q, int64_t G, int64_t d, const float* k, int64_t n,
               float scale, float* scores, int64_t ss);
void GenericPv(const float* pr, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n,
               float* o, int64_t os);
// fp16 rows: each row converted with the table's f16_to_f32, then as above (bit-identical).
void GenericQkF16(const Primitives& p, const float* q, int64_t G, int64_t d,
                  const uint16_t* const* rows, int64_t n, float scale, float* scores, int64_t ss);
void GenericPvF16(const Primitives& p, const float* pr, int64_t ps, int64_t G, int64_t d,
                  const uint16_t* const* rows, int64_t n, float* o, int64_t os);
// The same, bound to one ISA's table, as entries for that table.
template <const Primitives& (*Table)()>
void GenericQkF16Of(const float* q, int64_t G, int64_t d, const uint16_t* const* rows, int64_t n,
                    float scale, float* scores, int64_t ss) {
  GenericQkF16(Table(), q, G, d, rows, n, scale, scores, ss);
}
template <const Primitives& (*Table)()>
void GenericPvF16Of(const float* pr, int64_t ps, int64_t G, int64_t d, const uint16_t* const* rows,
                    int64_t n, float* o, int64_t os) {
  GenericPvF16(Table(), pr, ps, G, d, rows, n, o, os);
}
template <const Primitives& (*Table)()>
void GenericQkOf(const float* q, int64_t G, int64_t d, const float* k, int64_t n, float scale,
                 float* scores, int64_t ss) {
  GenericQk(Table(), q, G, d, k, n, scale, scores, ss);
}

}  // namespace kvmesh::kernels::cpu
