// Internal: what the AVX2 table's files share (primitives_avx2.cc, the table and most of its
// kernels; primitives_avx2_packed.cc, the packed products; primitives_avx2_lanes.cc, attention
// with the query heads in vector lanes).
#pragma once

#include <immintrin.h>

#include <algorithm>
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

// The lines of an Ahead asked for evenly over a kernel's loop steps (`slots` of them: one
// every slots / lines steps), not one a step from the first; the kernel asks for what is left
// at its end (AskAll). Asked for from the first steps, a lane unit's 256 lines of the next
// chunk went out in a burst and the loads after it waited (Zen 3: K and V staging ~10% of a
// lane unit's samples). In-process A/B against one a step, Zen 3: the lane kernels'
// BM_PagedAttentionSharedDecode 1024/16/2/100 0.937x, 4096/16/2/100 0.940x,
// BM_PagedAttentionPrefill 1024|4096/64/2 0.970x, the 16-sequence decode step 0.977x at 1K,
// 0.965x at 4K, 0.906x at 8K (forty-first session); qk_t_f16 / pv_f16 (with a several-row task
// giving each row's p.v half its share: kernels/cpu/attention.cc), the 4-sequence decode step
// 0.877-0.954x at 4K (forty-second session).
struct Spread {
  Ahead a;
  int64_t every, left;
  Spread(const Ahead& all, int64_t slots)
      : a(all), every(std::max<int64_t>(1, slots / std::max<int64_t>(1, all.n))), left(every) {}
  void Step() {
    if (--left == 0) {
      left = every;
      a.One();
    }
  }
};

// Sets the table's packed products: packed_tile and packed_tile_a8.
void SetAvx2PackedEntries(Primitives& d);

// Sets the table's lane entries: qk_lanes, exp_lanes, pv_lanes, transpose_f32 and lane_heads.
void SetAvx2LaneEntries(Primitives& d);

}  // namespace kvmesh::kernels::cpu
