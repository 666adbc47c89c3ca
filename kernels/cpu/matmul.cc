#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/packed.h"
#include "util/aligned_vector.h"

namespace kvmesh::kernels {
namespace {

// Weight rows kept hot in L1 while all tokens stream past; one packed group (kernels/packed.h).
constexpr int64_t kRowTile = kPackRows;

// Q3_K, IQ4_NL and IQ4_XS take it only in their packed groups; their other rows, and Q2_K's,
// run FloatTile.
bool IsIntegerPath(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
         (HasSmallValues(t) && PackableType(t));
}

// The tokens' activations, quantised once per product input: 16-bit blocks for the integer
// paths, 8-bit ones for rows packed for them (kernels/packed.h ActBits); null where not needed.
struct Quantised {
  BlockA16* a16 = nullptr;
  BlockA8* a8 = nullptr;
  uint8_t* a16_split = nullptr;  // a16's blocks split into bytes, where the table uses them
  cpu::BlockA16Head* a16_heads = nullptr;  // and their scales
};

// Quantises the activations (in parallel over tokens) into the buffers, in the widths asked for;
// `prepare` (if set) first fills the rows.
Quantised QuantizeActivations(const float* x, int64_t tokens, int64_t cols, bool a16, bool a8,
                              ThreadPool& pool, const PrepareRows& prepare,
                              util::AlignedVector<uint8_t>& buf16,
                              util::AlignedVector<uint8_t>& buf8,
                              util::AlignedVector<uint8_t>& buf_split) {
  const int64_t nb = cols / kQK;
  Quantised q;
  if (a16) {
    buf16.resize(static_cast<size_t>(tokens * nb) * sizeof(BlockA16));
    q.a16 = reinterpret_cast<BlockA16*>(buf16.data());
  }
  if (a8) {
    buf8.resize(static_cast<size_t>(tokens * nb) * sizeof(BlockA8));
    q.a8 = reinterpret_cast<BlockA8*>(buf8.data());
  }
  const auto& prims = cpu::Prims();
  if (a16 && prims.split_a16 != nullptr && tokens >= cpu::kTileMinTokens) {
    buf_split.resize(static_cast<size_t>(tokens * nb * (64 + sizeof(cpu::BlockA16Head))));
    q.a16_split = buf_split.data();
    q.a16_heads = reinterpret_cast<cpu::BlockA16Head*>(buf_split.data() + tokens * nb * 64);
  }
  pool.ParallelFor(tokens, 1, [&](int64_t t0, int64_t t1) {
    if (prepare) prepare(t0, t1);
    for (int64_t t = t0; t < t1; ++t) {
      if (a16) prims.quantize_a16(x + t * cols, q.a16 + t * nb, cols);
      if (q.a16_split != nullptr) {
        prims.split_a16(q.a16 + t * nb, nb, q.a16_split + t * nb * 64, q.a16_heads + t * nb);
      }
      if (a8) prims.quantize_a8(x + t * cols, q.a8 + t * nb, cols);
    }
  });
  return q;
}

// Whether tile [r0, r1) of w runs on its packed groups.
bool RunsPacked(const WeightMatrix& w, int64_t r0, int64_t r1) {
  return w.packed != nullptr && r0 % kPackRows == 0 && r1 - r0 == kPackRows && r1 <= w.packed_rows;
}

// Rows [r0, r1) of one integer-path product against every token.
template <typename WBlock, typename Dot>
void QuantTile(const MatMulArgs& a, int64_t r0, int64_t r1, const BlockA16* xq, Dot dot,
               cpu::Primitives::Tile4x4 tile4) {
  const int64_t nb = a.w.cols / kQK;
  const auto* base = static_cast<const uint8_t*>(a.w.data);
  int64_t r = r0;
  if (tile4 != nullptr && a.tokens >= 4) {
    for (; r + 4 <= r1; r += 4) {
      int64_t t = 0;
      for (; t + 4 <= a.tokens; t += 4) {
        tile4(base + r * a.w.row_bytes, a.w.row_bytes, xq + t * nb, nb, nb, a.out + t * a.ldo + r,
              a.ldo);
      }
      for (; t < a.tokens; ++t) {
        for (int64_t rr = r; rr < r + 4; ++rr) {
          a.out[t * a.ldo + rr] =
              dot(reinterpret_cast<const WBlock*>(base + rr * a.w.row_bytes), xq + t * nb, nb);
        }
      }
    }
  }
  for (int64_t t = 0; t < a.tokens; ++t) {
    const BlockA16* xt = xq + t * nb;
    float* ot = a.out + t * a.ldo;
    for (int64_t rr = r; rr < r1; ++rr) {
      ot[rr] = dot(reinterpret_cast<const WBlock*>(base + rr * a.w.row_bytes), xt, nb);
    }
  }
}

// Types without an integer path, and the rows of Q2_K, Q3_K, IQ4_NL and IQ4_XS not run packed:
// dequantise the rows once per call, then fp32 dot products against every token. (The small
// types' integer dot per row and token, plain C++, made 16 tokens cost 16 times one: 4096 x
// 4096 Q2_K 61 ms against 3.6.)
void FloatTile(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const auto& dots = cpu::Prims();
  const auto* base = static_cast<const uint8_t*>(a.w.data);
  const int64_t cols = a.w.cols;
  thread_local std::vector<float> tile;
  tile.resize(static_cast<size_t>(kRowTile * cols));
  for (int64_t r = r0; r < r1; ++r) {
    if (a.w.type == DType::kF32) continue;
    DequantizeRow(a.w.type, base + r * a.w.row_bytes, tile.data() + (r - r0) * cols, cols);
  }
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* xt = a.x + t * cols;
    float* ot = a.out + t * a.ldo;
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = a.w.type == DType::kF32
                            ? reinterpret_cast<const float*>(base + r * a.w.row_bytes)
                            : tile.data() + (r - r0) * cols;
      ot[r] = dots.f32_f32(wr, xt, cols);
    }
  }
}

void RunTile(const MatMulArgs& a, int64_t r0, int64_t r1, const Quantised& q) {
  const auto& d = cpu::Prims();
  if (RunsPacked(a.w, r0, r1)) {
    const int64_t nb = a.w.cols / kQK;
    const int64_t group_bytes = nb * PackedGroupBlockBytes(a.w.type);
    const uint8_t* group = a.w.packed + r0 / kPackRows * group_bytes;
    const uint8_t* next = r1 + kPackRows <= a.w.packed_rows ? group + group_bytes : nullptr;
    if (a.w.packed_a8) {
      return d.packed_tile_a8(a.w.type, group, nb, q.a8, nb, a.tokens, a.out + r0, a.ldo, next);
    }
    if (q.a16_split != nullptr) {
      return d.packed_tile_split(a.w.type, group, nb, q.a16, q.a16_split, q.a16_heads, nb, a.tokens,
                                 a.out + r0, a.ldo, next);
    }
    return d.packed_tile(a.w.type, group, nb, q.a16, nb, a.tokens, a.out + r0, a.ldo, next);
  }
  const BlockA16* xq = q.a16;
  switch (a.w.type) {
    case DType::kQ4_1:
      return QuantTile<BlockQ4_1>(a, r0, r1, xq, d.q4_1_a16, d.q4_1_tile);
    case DType::kQ4_0:
      return QuantTile<BlockQ4_0>(a, r0, r1, xq, d.q4_0_a16, d.q4_0_tile);
    case DType::kQ5_0:
      return QuantTile<BlockQ5_0>(a, r0, r1, xq, d.q5_0_a16, nullptr);
    case DType::kQ5_1:
      return QuantTile<BlockQ5_1>(a, r0, r1, xq, d.q5_1_a16, nullptr);
    case DType::kQ8_0:
      return QuantTile<BlockQ8_0>(a, r0, r1, xq, d.q8_0_a16, d.q8_0_tile);
    case DType::kQ4_K:
      return QuantTile<BlockQ4_K>(a, r0, r1, xq, d.q4_k_a16, nullptr);
    case DType::kQ5_K:
      return QuantTile<BlockQ5_K>(a, r0, r1, xq, d.q5_k_a16, nullptr);
    case DType::kQ6_K:
      return QuantTile<BlockQ6_K>(a, r0, r1, xq, d.q6_k_a16, nullptr);
    default:
      return FloatTile(a, r0, r1);
  }
}

}  // namespace

void MatMulManyCpu(std::span<const MatMulArgs> mats, ThreadPool& pool, const PrepareRows& prepare) {
  if (mats.empty() || mats[0].tokens <= 0) return;
  struct Tile {
    int32_t m;
    int64_t r0, r1;
  };
  // Per calling thread; the workers reach it through this reference (a lambda naming a
  // thread_local directly would see the worker's own instance).
  thread_local std::vector<Tile> tiles_storage;
  std::vector<Tile>& tiles = tiles_storage;
  tiles.clear();
  bool a16 = false, a8 = false;
  for (size_t m = 0; m < mats.size(); ++m) {
    const MatMulArgs& a = mats[m];
    const int64_t end = a.row_end < 0 ? a.w.rows : a.row_end;
    for (int64_t r = a.row_begin; r < end; r += kRowTile) {
      const int64_t r1 = std::min(r + kRowTile, end);
      tiles.push_back({static_cast<int32_t>(m), r, r1});
      if (!IsIntegerPath(a.w.type)) continue;
      const bool eight = a.w.packed_a8 && RunsPacked(a.w, r, r1);
      a8 |= eight;
      a16 |= !eight;
    }
  }
  thread_local util::AlignedVector<uint8_t> act16, act8, act_split;
  Quantised xq;
  if (a16 || a8) {
    xq = QuantizeActivations(mats[0].x, mats[0].tokens, mats[0].w.cols, a16, a8, pool, prepare,
                             act16, act8, act_split);
  } else if (prepare) {
    pool.ParallelFor(mats[0].tokens, 1, prepare);
  }
  // Each thread owns a contiguous share of the tiles (so its weight stream stays sequential for
  // the prefetcher) and walks it through a cursor; a thread done with its own share takes the
  // remaining tiles of the others' from the same cursors, so a core slowed for a moment (this
  // is a shared machine) does not hold the other at the join.
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  const int n_threads = static_cast<int>(std::min<int64_t>(pool.size(), n_tiles));
  if (n_threads <= 1) {
    for (const Tile& t : tiles) RunTile(mats[t.m], t.r0, t.r1, xq);
    return;
  }
  struct alignas(64) Cursor {
    std::atomic<int64_t> next;
    int64_t end;
  };
  thread_local std::vector<Cursor> cursors_storage;
  std::vector<Cursor>& cursors = cursors_storage;
  if (cursors.size() < static_cast<size_t>(n_threads)) cursors = std::vector<Cursor>(n_threads);
  for (int s = 0; s < n_threads; ++s) {
    cursors[s].next.store(s * n_tiles / n_threads, std::memory_order_relaxed);
    cursors[s].end = (s + 1) * n_tiles / n_threads;
  }
  // Claims are guided: a quarter of what is left of the share, at least about 8 token-tiles of
  // work. A claim is a locked instruction, which waits for the tile's stores to drain: one per
  // tile cost 4% of decode at 16 sequences.
  const int64_t min_claim = std::max<int64_t>(1, 8 / mats[0].tokens);
  pool.Run([&](int t, int) {
    if (t >= n_threads) return;
    for (int k = 0; k < n_threads; ++k) {
      Cursor& c = cursors[(t + k) % n_threads];
      for (;;) {
        const int64_t seen = c.next.load(std::memory_order_relaxed);
        if (seen >= c.end) break;
        const int64_t claim = std::max(min_claim, (c.end - seen) / 4);
        const int64_t i = c.next.fetch_add(claim, std::memory_order_relaxed);
        if (i >= c.end) break;
        for (int64_t j = i; j < std::min(i + claim, c.end); ++j) {
          RunTile(mats[tiles[j].m], tiles[j].r0, tiles[j].r1, xq);
        }
      }
    }
  });
}

void MatMulCpu(const MatMulArgs& a, ThreadPool& pool, const PrepareRows& prepare) {
  MatMulManyCpu({&a, 1}, pool, prepare);
}

}  // namespace kvmesh::kernels
