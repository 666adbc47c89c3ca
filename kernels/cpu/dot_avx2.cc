// AVX2 + FMA + F16C versions of the dot primitives. Compiled with target attributes so the
// binary runs on any x86-64; Dots() selects them only when CPUID reports the features.
#include <immintrin.h>

#include "kernels/cpu/dot.h"

#define KVMESH_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace kvmesh::kernels::cpu {
namespace {

KVMESH_AVX2 inline float H2F(uint16_t h) { return _cvtsh_ss(h); }

KVMESH_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 int32 lanes whose sum is sum_j w[j] * a[j] over 32 elements: w as two vectors of 16 int16
// (elements 0..15, 16..31), a the activation block's 32 int16.
KVMESH_AVX2 inline __m256i Madd32(__m256i w_lo, __m256i w_hi, const int16_t* a) {
  const __m256i a_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i a_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16));
  return _mm256_add_epi32(_mm256_madd_epi16(w_lo, a_lo), _mm256_madd_epi16(w_hi, a_hi));
}

// The 32 4-bit values of a block as int16: low nibbles are elements 0..15, high nibbles 16..31.
KVMESH_AVX2 inline void Nibbles16(const uint8_t* p, __m256i* lo, __m256i* hi) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  *lo = _mm256_cvtepu8_epi16(_mm_and_si128(packed, mask));
  *hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), mask));
}

KVMESH_AVX2 float DotQ4_0A16(const BlockQ4_0* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i lo, hi;
    Nibbles16(x[i].qs, &lo, &hi);
    const __m256i off = _mm256_set1_epi16(8);
    const __m256i s = Madd32(_mm256_sub_epi16(lo, off), _mm256_sub_epi16(hi, off), y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
  }
  return HSum(acc);
}

KVMESH_AVX2 float DotQ4_1A16(const BlockQ4_1* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    __m256i lo, hi;
    Nibbles16(x[i].qs, &lo, &hi);
    const __m256i s = Madd32(lo, hi, y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
    mins += H2F(x[i].m) * y[i].d * static_cast<float>(y[i].sum);
  }
  return HSum(acc) + mins;
}

KVMESH_AVX2 float DotQ8_0A16(const BlockQ8_0* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16));
    const __m256i s = Madd32(_mm256_cvtepi8_epi16(q0), _mm256_cvtepi8_epi16(q1), y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
  }
  return HSum(acc);
}

KVMESH_AVX2 float DotF32F32(const float* x, const float* y, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
  float s = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

KVMESH_AVX2 inline __m256 LoadH8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

KVMESH_AVX2 float DotF32F16(const float* x, const uint16_t* y, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), LoadH8(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), LoadH8(y + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), LoadH8(y + i), a0);
  float s = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * H2F(y[i]);
  return s;
}

KVMESH_AVX2 void ScaleAxpyF16(float* y, float s, float a, const uint16_t* v, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 yy = _mm256_mul_ps(_mm256_loadu_ps(y + i), vs);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LoadH8(v + i), yy));
  }
  for (; i < n; ++i) y[i] = y[i] * s + a * H2F(v[i]);
}

}  // namespace

const DotTable& Avx2Dots() {
  static const DotTable t{.q4_0_a16 = DotQ4_0A16,
                          .q4_1_a16 = DotQ4_1A16,
                          .q8_0_a16 = DotQ8_0A16,
                          .f32_f32 = DotF32F32,
                          .f32_f16 = DotF32F16,
                          .scale_axpy_f16 = ScaleAxpyF16};
  return t;
}

}  // namespace kvmesh::kernels::cpu
