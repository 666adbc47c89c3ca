// Internal: what the AVX2 table's files share (primitives_avx2.cc, the table and most of its
// kernels; primitives_avx2_lanes.cc, attention with the query heads in vector lanes).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/primitives.h"

#define KVMESH_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVMESH_AVX2_INLINE KVMESH_AVX2 __attribute__((always_inline)) inline

namespace kvmesh::kernels::cpu {

// The sum of v's 8 lanes: (0 + 4) + (2 + 6), plus (1 + 5) + (3 + 7).
KVMESH_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 lanes: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), a degree-6
// polynomial for exp(r), and 2^n built in the exponent bits. Inputs are clamped to [-87.3, 88.0]
// so the result stays a normal float (exp of anything lower is taken as exp(-87.3) ~ 1e-38).
KVMESH_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(vexp::kLo)), _mm256_set1_ps(vexp::kHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(vexp::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(vexp::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(vexp::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(vexp::kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vexp::kPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// A value pinned in a register (without it the compiler folds a load shared by several heads'
// multiply-adds into each of them).
KVMESH_AVX2 inline __m256 InRegister(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

// Sets the table's lane entries: qk_lanes, exp_lanes, pv_lanes, transpose_f32 and lane_heads.
void SetAvx2LaneEntries(Primitives& d);

}  // namespace kvmesh::kernels::cpu
