// The AVX-512 table's attention entries with the query heads in vector lanes (primitives.h
// qk_lanes, exp_lanes, pv_lanes, transpose_f32; engine.md "Attention").
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/primitives_avx512.h"

namespace kvmesh::kernels::cpu {
namespace {

// primitives.h transpose_f32: 16 x 16 blocks in registers (unpack pairs of rows, then fours,
// then the 128-bit quarters twice), the edges element by element.
KVMESH_AVX512 void TransposeF32(const float* src, int64_t ss, float* dst, int64_t ds, int64_t rows,
                                int64_t cols) {
  const int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < r16; r0 += 16) {
    for (int64_t c0 = 0; c0 < c16; c0 += 16) {
      __m512 a[16], b[16];
      for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_ps(src + (r0 + i) * ss + c0);
      for (int i = 0; i < 16; i += 2) {
        b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        a[i] = _mm512_shuffle_ps(b[i], b[i + 2], 0x44);
        a[i + 1] = _mm512_shuffle_ps(b[i], b[i + 2], 0xEE);
        a[i + 2] = _mm512_shuffle_ps(b[i + 1], b[i + 3], 0x44);
        a[i + 3] = _mm512_shuffle_ps(b[i + 1], b[i + 3], 0xEE);
      }
      // a[4q + k]: rows 4q..4q+3, columns {k, 4 + k, 8 + k, 12 + k} (k = 0, 1, 2, 3 as built).
      for (int i = 0; i < 8; ++i) {
        const int lo = (i / 4) * 8 + i % 4;  // pairs (0,4) (1,5) (2,6) (3,7) (8,12) ...
        b[2 * i] = _mm512_shuffle_f32x4(a[lo], a[lo + 4], 0x88);
        b[2 * i + 1] = _mm512_shuffle_f32x4(a[lo], a[lo + 4], 0xDD);
      }
      for (int i = 0; i < 4; ++i) {
        for (int h = 0; h < 2; ++h) {
          // b[2 * i + h] (rows 0-7) and b[8 + 2 * i + h] (rows 8-15) hold columns i + 4 * {h,
          // h + 2} of their 8 rows: their halves make columns i + 4h and i + 4h + 8.
          const __m512 x = b[2 * i + h], y = b[8 + 2 * i + h];
          _mm512_storeu_ps(dst + (c0 + i + 4 * h) * ds + r0, _mm512_shuffle_f32x4(x, y, 0x88));
          _mm512_storeu_ps(dst + (c0 + i + 4 * h + 8) * ds + r0, _mm512_shuffle_f32x4(x, y, 0xDD));
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = r < r16 ? c16 : 0; c < cols; ++c) dst[c * ds + r] = src[r * ss + c];
  }
}

// Heads in lanes (primitives.h qk_lanes / exp_lanes / pv_lanes): up to kLaneRv vectors of 16
// heads per pass. A q.k tile is RV vectors of heads x KJ keys of accumulators, a p.v tile RV x
// DI dims; both near 24 registers, with the heads' vectors and one broadcast beside them.
constexpr int kLaneRv = 6;
template <int RV>
constexpr int kLaneKeys = RV == 1   ? 16
                          : RV <= 3 ? 8
                                    : 4;
template <int RV>
constexpr int kLaneDims = RV == 1   ? 16
                          : RV == 2 ? 8
                          : RV == 3 ? 4
                                    : 2;

// Calls f.template operator()<RV>(r0) for H heads' vectors of 16 in groups of up to kLaneRv: RV
// of them from vector r0.
template <typename F>
KVMESH_AVX512 inline void ForLaneGroups(int64_t H, const F& f) {
  const int64_t rv_all = (H + 15) / 16;
  for (int64_t r0 = 0; r0 < rv_all; r0 += kLaneRv) {
    WithCount<1, kLaneRv>(std::min<int64_t>(kLaneRv, rv_all - r0),
                          [&]<int RV>() KVMESH_AVX512 { f.template operator()<RV>(r0); });
  }
}

// Keys [0, KJ) of kt / st (the caller offsets both), heads' vectors [0, RV) of qt / st.
template <int RV, int KJ>
KVMESH_AVX512 void QkLanesTile(const float* qt, int64_t hs, int64_t d, const float* kt, int64_t kts,
                               float* st, __m512* mx, Ahead& ahead) {
  __m512 acc[KJ][RV];
  Ahead a = ahead;  // in registers for the loop
  {
    __m512 qv[RV];
    for (int r = 0; r < RV; ++r) qv[r] = InRegister(_mm512_loadu_ps(qt + 16 * r));
    for (int j = 0; j < KJ; ++j) {
      const __m512 kb = InRegister(_mm512_set1_ps(kt[j]));
      for (int r = 0; r < RV; ++r) acc[j][r] = _mm512_mul_ps(qv[r], kb);
    }
  }
  for (int64_t i = 1; i < d; ++i) {
    a.One();  // one line of those ahead per dim
    __m512 qv[RV];
    for (int r = 0; r < RV; ++r) qv[r] = InRegister(_mm512_loadu_ps(qt + i * hs + 16 * r));
    for (int j = 0; j < KJ; ++j) {
      const __m512 kb = InRegister(_mm512_set1_ps(kt[i * kts + j]));
      for (int r = 0; r < RV; ++r) acc[j][r] = _mm512_fmadd_ps(qv[r], kb, acc[j][r]);
    }
  }
  for (int j = 0; j < KJ; ++j) {
    for (int r = 0; r < RV; ++r) {
      _mm512_storeu_ps(st + j * hs + 16 * r, acc[j][r]);
      mx[r] = _mm512_max_ps(mx[r], acc[j][r]);
    }
  }
  ahead = a;
}

KVMESH_AVX512 void QkLanes(const float* qt, int64_t hs, int64_t H, int64_t d, const float* kt,
                           int64_t kts, int64_t n, float* st, float* chunk_max, Ahead* ahead) {
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  ForLaneGroups(H, [&]<int RV>(int64_t r0) KVMESH_AVX512 {
    constexpr int KJ = kLaneKeys<RV>;
    __m512 mx[RV];
    for (int r = 0; r < RV; ++r) mx[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const float* q = qt + 16 * r0;
    float* s = st + 16 * r0;
    int64_t j = 0;
    for (; j + KJ <= n; j += KJ) QkLanesTile<RV, KJ>(q, hs, d, kt + j, kts, s + j * hs, mx, a);
    for (; j < n; ++j) QkLanesTile<RV, 1>(q, hs, d, kt + j, kts, s + j * hs, mx, a);
    for (int r = 0; r < RV; ++r) _mm512_storeu_ps(chunk_max + 16 * (r0 + r), mx[r]);
  });
  a.All();
}

// Per vector of 16 heads: the exps of keys j = 16 * v + l summed per l in order of v, then the
// 16 sums of l by SumOfLanes's tree (primitives_avx512.cc) (l with l + 8, then with + 4, then (0 +
// 2) + (1 + 3)): for each head (lane) ExpShiftedSumsG's order, whose lane l holds those keys.
KVMESH_AVX512 void ExpLanes(float* st, int64_t hs, int64_t H, const float* shift, int64_t n,
                            float* sums) {
  for (int64_t r = 0; r * 16 < H; ++r) {
    const __m512 sh = _mm512_loadu_ps(shift + 16 * r);
    __m512 part[16];
    for (int l = 0; l < 16; ++l) {
      part[l] = _mm512_setzero_ps();
      for (int64_t j = l; j < n; j += 16) {
        float* x = st + j * hs + 16 * r;
        const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x), sh));
        _mm512_storeu_ps(x, e);
        part[l] = _mm512_add_ps(part[l], e);
      }
    }
    for (int l = 0; l < 8; ++l) part[l] = _mm512_add_ps(part[l + 8], part[l]);
    for (int l = 0; l < 4; ++l) part[l] = _mm512_add_ps(part[l + 4], part[l]);
    const __m512 sum =
        _mm512_add_ps(_mm512_add_ps(part[0], part[2]), _mm512_add_ps(part[1], part[3]));
    _mm512_storeu_ps(sums + 16 * r, sum);
  }
}

// Dims [x0, x0 + DI) of heads' vectors [0, RV) (the caller offsets st, rescale and ot).
template <int RV, int DI>
KVMESH_AVX512 void PvLanesTile(const float* st, int64_t hs, int64_t d, const float* vf, int64_t n,
                               const float* rescale, float* ot, int64_t x0, Ahead& ahead) {
  __m512 acc[DI][RV];
  Ahead a = ahead;  // in registers for the loop
  for (int r = 0; r < RV; ++r) {
    const __m512 sc = _mm512_loadu_ps(rescale + 16 * r);
    for (int x = 0; x < DI; ++x) {
      acc[x][r] = _mm512_mul_ps(_mm512_loadu_ps(ot + (x0 + x) * hs + 16 * r), sc);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    a.One();  // one line of those ahead per key
    __m512 w[RV];
    for (int r = 0; r < RV; ++r) w[r] = InRegister(_mm512_loadu_ps(st + j * hs + 16 * r));
    for (int x = 0; x < DI; ++x) {
      const __m512 vb = InRegister(_mm512_set1_ps(vf[j * d + x0 + x]));
      for (int r = 0; r < RV; ++r) acc[x][r] = _mm512_fmadd_ps(w[r], vb, acc[x][r]);
    }
  }
  for (int x = 0; x < DI; ++x) {
    for (int r = 0; r < RV; ++r) _mm512_storeu_ps(ot + (x0 + x) * hs + 16 * r, acc[x][r]);
  }
  ahead = a;
}

KVMESH_AVX512 void PvLanes(const float* st, int64_t hs, int64_t H, int64_t d, const float* vf,
                           int64_t n, const float* rescale, float* ot, Ahead* ahead) {
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  ForLaneGroups(H, [&]<int RV>(int64_t r0) KVMESH_AVX512 {
    constexpr int DI = kLaneDims<RV>;
    for (int64_t x0 = 0; x0 < d; x0 += DI) {
      PvLanesTile<RV, DI>(st + 16 * r0, hs, d, vf, n, rescale + 16 * r0, ot + 16 * r0, x0, a);
    }
  });
  a.All();
}

}  // namespace

void SetLaneEntries(Primitives& d) {
  d.qk_lanes = QkLanes;
  d.exp_lanes = ExpLanes;
  d.pv_lanes = PvLanes;
  d.transpose_f32 = TransposeF32;
  d.lane_heads = 32;
}

}  // namespace kvmesh::kernels::cpu
