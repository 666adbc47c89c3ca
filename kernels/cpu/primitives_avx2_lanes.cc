// The AVX2 table's attention entries with the query heads in vector lanes (primitives.h
// qk_lanes, exp_lanes, pv_lanes, transpose_f32; engine.md "Attention"): the AVX-512 table's
// (primitives_avx512_lanes.cc) in vectors of 8 heads and tiles sized for 16 registers, each
// head's bits those of this table's qk_t, exp_shifted_sum and pv.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/primitives_avx2.h"

namespace kvmesh::kernels::cpu {
namespace {

// primitives.h transpose_f32: 8 x 8 blocks in registers (unpack pairs of rows, then fours, then
// the 128-bit halves), the edges element by element.
KVMESH_AVX2 void TransposeF32(const float* src, int64_t ss, float* dst, int64_t ds, int64_t rows,
                              int64_t cols) {
  const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (int64_t r0 = 0; r0 < r8; r0 += 8) {
    for (int64_t c0 = 0; c0 < c8; c0 += 8) {
      __m256 a[8], b[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(src + (r0 + i) * ss + c0);
      for (int i = 0; i < 8; i += 2) {
        b[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        a[i] = _mm256_shuffle_ps(b[i], b[i + 2], 0x44);
        a[i + 1] = _mm256_shuffle_ps(b[i], b[i + 2], 0xEE);
        a[i + 2] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0x44);
        a[i + 3] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0xEE);
      }
      // a[4q + k]: rows 4q..4q+3, columns k and 4 + k (one per 128-bit half).
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(dst + (c0 + k) * ds + r0, _mm256_permute2f128_ps(a[k], a[4 + k], 0x20));
        _mm256_storeu_ps(dst + (c0 + 4 + k) * ds + r0,
                         _mm256_permute2f128_ps(a[k], a[4 + k], 0x31));
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c) dst[c * ds + r] = src[r * ss + c];
  }
}

// Up to kLaneRv vectors of 8 heads per pass. A q.k tile is RV vectors of heads x KJ keys of
// accumulators, a p.v tile RV x DI dims: at most 12, with the heads' vectors and one broadcast
// beside them in the 16 registers.
constexpr int kLaneRv = 3;
template <int RV>
constexpr int kLaneKeys = RV == 1 ? 8 : 4;
template <int RV>
constexpr int kLaneDims = RV == 1 ? 8 : 4;

// Calls f.template operator()<RV>(r0) for H heads' vectors of 8 in groups of up to kLaneRv: RV
// of them from vector r0.
template <typename F>
KVMESH_AVX2 inline void ForLaneGroups(int64_t H, const F& f) {
  const int64_t rv_all = (H + 7) / 8;
  for (int64_t r0 = 0; r0 < rv_all; r0 += kLaneRv) {
    switch (std::min<int64_t>(kLaneRv, rv_all - r0)) {
      case 1:
        f.template operator()<1>(r0);
        break;
      case 2:
        f.template operator()<2>(r0);
        break;
      default:
        f.template operator()<3>(r0);
        break;
    }
  }
}

// Keys [0, KJ) of kt / st (the caller offsets both), heads' vectors [0, RV) of qt / st / mx.
// The running maxima stay in memory (mx): in registers they would crowd the tile's.
template <int RV, int KJ>
KVMESH_AVX2 void QkLanesTile(const float* qt, int64_t hs, int64_t d, const float* kt, int64_t kts,
                             float* st, float* mx, Spread& ahead) {
  __m256 acc[KJ][RV];
  Spread a = ahead;  // in registers for the loop
  {
    __m256 qv[RV];
    for (int r = 0; r < RV; ++r) qv[r] = InRegister(_mm256_loadu_ps(qt + 8 * r));
    for (int j = 0; j < KJ; ++j) {
      const __m256 kb = InRegister(_mm256_set1_ps(kt[j]));
      for (int r = 0; r < RV; ++r) acc[j][r] = _mm256_mul_ps(qv[r], kb);
    }
  }
  for (int64_t i = 1; i < d; ++i) {
    a.Step();
    __m256 qv[RV];
    for (int r = 0; r < RV; ++r) qv[r] = InRegister(_mm256_loadu_ps(qt + i * hs + 8 * r));
    for (int j = 0; j < KJ; ++j) {
      const __m256 kb = InRegister(_mm256_set1_ps(kt[i * kts + j]));
      for (int r = 0; r < RV; ++r) acc[j][r] = _mm256_fmadd_ps(qv[r], kb, acc[j][r]);
    }
  }
  for (int r = 0; r < RV; ++r) {
    __m256 m = _mm256_loadu_ps(mx + 8 * r);
    for (int j = 0; j < KJ; ++j) {
      _mm256_storeu_ps(st + j * hs + 8 * r, acc[j][r]);
      m = _mm256_max_ps(m, acc[j][r]);
    }
    _mm256_storeu_ps(mx + 8 * r, m);
  }
  ahead = a;
}

KVMESH_AVX2 void QkLanes(const float* qt, int64_t hs, int64_t H, int64_t d, const float* kt,
                         int64_t kts, int64_t n, float* st, float* chunk_max, Ahead* ahead) {
  // Steps: a group's tiles (about n / 4) x d - 1 dims, per group of kLaneRv vectors.
  const int64_t groups = (H + 8 * kLaneRv - 1) / (8 * kLaneRv);
  Spread a(ahead != nullptr ? *ahead : Ahead{}, groups * ((n + 3) / 4) * (d - 1));
  std::fill_n(chunk_max, (H + 7) / 8 * 8, -std::numeric_limits<float>::infinity());
  ForLaneGroups(H, [&]<int RV>(int64_t r0) KVMESH_AVX2 {
    constexpr int KJ = kLaneKeys<RV>;
    const float* q = qt + 8 * r0;
    float* s = st + 8 * r0;
    float* mx = chunk_max + 8 * r0;
    int64_t j = 0;
    for (; j + KJ <= n; j += KJ) QkLanesTile<RV, KJ>(q, hs, d, kt + j, kts, s + j * hs, mx, a);
    for (; j < n; ++j) QkLanesTile<RV, 1>(q, hs, d, kt + j, kts, s + j * hs, mx, a);
  });
  a.a.All();
  if (ahead != nullptr) *ahead = a.a;
}

// Per vector of 8 heads: the exps of keys j = 8 * v + l summed per l in order of v, then the 8
// sums of l as HSum adds lanes: for each head (lane) ExpShiftedSum's order, whose lane l holds
// those keys.
KVMESH_AVX2 void ExpLanes(float* st, int64_t hs, int64_t H, const float* shift, int64_t n,
                          float* sums) {
  for (int64_t r = 0; r * 8 < H; ++r) {
    const __m256 sh = _mm256_loadu_ps(shift + 8 * r);
    __m256 part[8];
    for (int l = 0; l < 8; ++l) {
      part[l] = _mm256_setzero_ps();
      for (int64_t j = l; j < n; j += 8) {
        float* x = st + j * hs + 8 * r;
        const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x), sh));
        _mm256_storeu_ps(x, e);
        part[l] = _mm256_add_ps(part[l], e);
      }
    }
    const __m256 even = _mm256_add_ps(_mm256_add_ps(part[0], part[4]),  //
                                      _mm256_add_ps(part[2], part[6]));
    const __m256 odd = _mm256_add_ps(_mm256_add_ps(part[1], part[5]),  //
                                     _mm256_add_ps(part[3], part[7]));
    _mm256_storeu_ps(sums + 8 * r, _mm256_add_ps(even, odd));
  }
}

// Dims [x0, x0 + DI) of heads' vectors [0, RV) (the caller offsets st, rescale and ot).
template <int RV, int DI>
KVMESH_AVX2 void PvLanesTile(const float* st, int64_t hs, int64_t d, const float* vf, int64_t n,
                             const float* rescale, float* ot, int64_t x0, Spread& ahead) {
  __m256 acc[DI][RV];
  Spread a = ahead;  // in registers for the loop
  for (int r = 0; r < RV; ++r) {
    const __m256 sc = _mm256_loadu_ps(rescale + 8 * r);
    for (int x = 0; x < DI; ++x) {
      acc[x][r] = _mm256_mul_ps(_mm256_loadu_ps(ot + (x0 + x) * hs + 8 * r), sc);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    a.Step();
    __m256 w[RV];
    for (int r = 0; r < RV; ++r) w[r] = InRegister(_mm256_loadu_ps(st + j * hs + 8 * r));
    for (int x = 0; x < DI; ++x) {
      const __m256 vb = InRegister(_mm256_set1_ps(vf[j * d + x0 + x]));
      for (int r = 0; r < RV; ++r) acc[x][r] = _mm256_fmadd_ps(w[r], vb, acc[x][r]);
    }
  }
  for (int x = 0; x < DI; ++x) {
    for (int r = 0; r < RV; ++r) _mm256_storeu_ps(ot + (x0 + x) * hs + 8 * r, acc[x][r]);
  }
  ahead = a;
}

KVMESH_AVX2 void PvLanes(const float* st, int64_t hs, int64_t H, int64_t d, const float* vf,
                         int64_t n, const float* rescale, float* ot, Ahead* ahead) {
  // Steps: a group's dim tiles (about d / 4) x n keys, per group of kLaneRv vectors.
  const int64_t groups = (H + 8 * kLaneRv - 1) / (8 * kLaneRv);
  Spread a(ahead != nullptr ? *ahead : Ahead{}, groups * (d / 4) * n);
  ForLaneGroups(H, [&]<int RV>(int64_t r0) KVMESH_AVX2 {
    constexpr int DI = kLaneDims<RV>;
    for (int64_t x0 = 0; x0 < d; x0 += DI) {
      PvLanesTile<RV, DI>(st + 8 * r0, hs, d, vf, n, rescale + 8 * r0, ot + 8 * r0, x0, a);
    }
  });
  a.a.All();
  if (ahead != nullptr) *ahead = a.a;
}

}  // namespace

void SetAvx2LaneEntries(Primitives& d) {
  d.qk_lanes = QkLanes;
  d.exp_lanes = ExpLanes;
  d.pv_lanes = PvLanes;
  d.transpose_f32 = TransposeF32;
  d.lane_heads = 32;
}

}  // namespace kvmesh::kernels::cpu
