// Internal: Q6_K's 6-bit values as bytes, 256 bits at a time (AVX2 instructions), shared by the
// AVX2 and AVX-512 dots (each compiled for its own ISA; AVX-512 includes these instructions).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/quant.h"

namespace kvmesh::kernels::cpu {

// The four groups of 32 elements of half h (0 or 1) of a Q6_K super-block, in element order:
// 4 low bits from ql, 2 high bits from qh, not yet minus 32 (values 0..63).
__attribute__((target("avx2"), always_inline)) inline void Q6KGroups(const BlockQ6_K& x, int h,
                                                                     __m256i g[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  const uint8_t* ql = x.ql + 64 * h;
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h));
  const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  g[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
  g[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
  g[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
  g[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
}

}  // namespace kvmesh::kernels::cpu
