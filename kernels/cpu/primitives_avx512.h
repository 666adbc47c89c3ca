// Internal: what the AVX-512 table's files share (primitives_avx512.cc, the table and most of
// its kernels; primitives_avx512_packed.cc, the packed products; primitives_avx512_lanes.cc,
// attention with the query heads in vector lanes; primitives_avx512_bf16.cc, bf16 attention).
#pragma once

#include <cstdint>

// Before primitives.h: the AVX-512 files bring <immintrin.h> first through this header.
#include "kernels/cpu/avx512_intrinsics.h"
#include "kernels/cpu/primitives.h"

#define KVMESH_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")))

namespace kvmesh::kernels::cpu {

// v, pinned in a register: without this the compiler folds a load used by several heads' fused
// multiply-adds into each of them, and the loop becomes bound by loads instead of arithmetic.
KVMESH_AVX512 inline __m512 InRegister(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

// Calls f.template operator()<G>() for the run-time g, Lo <= g <= Hi.
template <int Lo, int Hi, typename F>
KVMESH_AVX512 inline void WithCount(int64_t g, const F& f) {
  if constexpr (Lo == Hi) {
    f.template operator()<Lo>();
  } else if (g == Lo) {
    f.template operator()<Lo>();
  } else {
    WithCount<Lo + 1, Hi>(g, f);
  }
}

// The vector exp of primitives.h (vexp), 16 lanes.
KVMESH_AVX512 inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(vexp::kLo)), _mm512_set1_ps(vexp::kHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(vexp::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(vexp::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(vexp::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(vexp::kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vexp::kPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // p * 2^n in one VSCALEFPS (vexp in primitives.h). Against building 2^n (convert, add, shift,
  // multiply), in-process A/B: BM_PagedAttentionSharedDecode 1024|4096/16/2/16|100 0.988-0.991x.
  return _mm512_scalef_ps(p, n);
}

// Attention's passes (head_dim 64): pv keeps up to kMaxG heads' outputs in registers for the
// whole chunk. Up to kWideG heads (several rows' heads: attention's pair_heads) run in one pass of
// narrower tiles instead: q.k 12 heads x 2 vectors of 16 keys, p.v 12 heads over half of d. Each
// K or V vector converted from fp16 then feeds twice the fused multiply-adds of a kMaxG pass. (24
// heads x 1 vector was slower: GCC kept those tiles' accumulators on the stack.)
constexpr int64_t kMaxG = 6;
constexpr int64_t kWideG = 12;

// Sets the table's packed products: packed_tile and packed_tile_a8.
void SetPackedEntries(Primitives& d);

// Sets the table's bf16 attention entries: to_bf16, qk_bf16, pv_bf16 and pair_heads_bf16.
void SetBf16Entries(Primitives& d);

// Sets the table's lane entries: qk_lanes, exp_lanes, pv_lanes, transpose_f32 and lane_heads.
void SetLaneEntries(Primitives& d);

}  // namespace kvmesh::kernels::cpu
