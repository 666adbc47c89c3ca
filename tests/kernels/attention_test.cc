// Attention kernels on every ISA table: against a naive softmax, bit for bit across batches,
// chunkings and paths (one row, several rows, lanes), and bf16 attention against its reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/isa_test.h"

namespace kvmesh::kernels {
namespace {

using isa_test::IsaTest;
using isa_test::Randn;
using isa_test::RelL2;

TEST_P(IsaTest, AttentionMatchesNaiveSoftmax) {
  ThreadPool pool(2);
  struct Case {
    int64_t tokens, n_heads, n_kv, hd, pos0;
  };
  // The decode cases with long contexts split the keys across threads and merge.
  for (const Case c : {Case{1, 9, 3, 64, 0}, Case{1, 9, 3, 64, 150}, Case{7, 4, 2, 24, 0},
                       Case{5, 6, 6, 17, 70}, Case{3, 3, 1, 8, 1}, Case{1, 9, 3, 64, 1500},
                       Case{2, 4, 1, 16, 900}, Case{1, 2, 2, 8, 5000},
                       // More query heads per KV head than one pass takes (71, as Falcon-7B).
                       Case{2, 71, 1, 64, 130}}) {
    const int64_t n_pos = c.pos0 + c.tokens;
    const int64_t stride = c.n_kv * c.hd;
    const auto kf = Randn(n_pos * stride, 5);
    const auto vf = Randn(n_pos * stride, 6);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    const auto q = Randn(c.tokens * c.n_heads * c.hd, 8, 0.5f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    std::vector<double> ref(q.size());
    const int64_t group = c.n_heads / c.n_kv;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t kvh = h / group;
        const int64_t n = c.pos0 + t + 1;
        std::vector<double> s(n);
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t i = 0; i < c.hd; ++i) {
            d += q[(t * c.n_heads + h) * c.hd + i] * Fp16ToFloat(k[j * stride + kvh * c.hd + i]);
          }
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int64_t i = 0; i < c.hd; ++i) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j)
            o += s[j] / z * Fp16ToFloat(v[j * stride + kvh * c.hd + i]);
          ref[(t * c.n_heads + h) * c.hd + i] = o;
        }
      }
    }
    std::vector<float> out(q.size(), 99.0f);
    AttentionCpu({q.data(), k.data(), v.data(), out.data(), c.tokens, c.n_heads, c.n_kv, c.hd,
                  stride, c.pos0, scale},
                 pool);
    EXPECT_LT(RelL2(out, ref), 1e-5)
        << "tokens=" << c.tokens << " pos0=" << c.pos0 << " hd=" << c.hd;
  }
}

// A batch over a paged cache: sequences sharing blocks of a long prefix (attended together,
// cascade style), prefill chunks and decode rows mixed, scrambled block ids. Every row must be
// bit-identical to its sequence run alone (and with another thread count), and close to a naive
// float64 softmax.
// Three block tables over a shuffled pool of 3 x per blocks of bs positions (A and B share their
// first 1300 positions' blocks; C is its own), and six sequences over them as one batch: odd and
// even key counts, a prefill chunk, rows sharing a prefix.
struct SharedPrefixBatch {
  struct S {
    int64_t tokens, pos0;
    const std::vector<int32_t>* table;
  };
  SharedPrefixBatch(int64_t bs, uint32_t seed) : per(2200 / bs + 1), n_blocks(3 * per) {
    std::vector<int32_t> perm(n_blocks);
    for (int32_t i = 0; i < n_blocks; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    ta.assign(perm.begin(), perm.begin() + per);
    tb = ta;
    for (int64_t i = 1300 / bs; i < per; ++i) tb[i] = perm[per + i];
    tc.assign(perm.begin() + 2 * per, perm.begin() + 3 * per);
    seqs = {{1, 1700, &ta}, {5, 1290, &tb}, {1, 2100, &tc},
            {1, 1450, &tb}, {3, 510, &ta},  {1, 40, &tc}};
    for (const S& q : seqs) {
      batch.push_back({rows, q.tokens, q.pos0, q.table->data()});
      rows += q.tokens;
    }
  }
  SharedPrefixBatch(const SharedPrefixBatch&) = delete;
  SharedPrefixBatch& operator=(const SharedPrefixBatch&) = delete;
  int64_t per, n_blocks, rows = 0;
  std::vector<int32_t> ta, tb, tc;
  std::vector<S> seqs;
  std::vector<AttentionSeq> batch;
};

TEST_P(IsaTest, PagedBatchIsBitIdenticalToEachSequenceAlone) {
  for (const int64_t bs : {16, 7}) {
    const int64_t n_heads = 9, n_kv = 3, hd = 64, stride = n_kv * hd;
    const SharedPrefixBatch sb(bs, static_cast<uint32_t>(bs));
    const int64_t n_blocks = sb.n_blocks, rows = sb.rows;
    const auto& seqs = sb.seqs;
    const auto& batch = sb.batch;
    const auto& tb = sb.tb;
    const auto kf = Randn(n_blocks * bs * stride, 11);
    const auto vf = Randn(n_blocks * bs * stride, 12);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    const auto q = Randn(rows * n_heads * hd, 13, 0.5f);
    const float scale = 0.125f;
    auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows, int th) {
      ThreadPool pool(th);
      std::vector<float> out(n_rows * n_heads * hd, 99.0f);
      PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                         bs * stride, b.data(), static_cast<int64_t>(b.size()), scale},
                        pool);
      return out;
    };
    const auto together = run(batch, q.data(), rows, 2);
    EXPECT_EQ(together, run(batch, q.data(), rows, 1)) << "thread count changed the bits";
    {
      // One plan serves every layer of a step (here: the cache's K and V, then the two swapped),
      // also one made for another thread count, and a plan object planned again for other
      // sequences serves those.
      ThreadPool pool(2);
      PagedAttentionPlan plan, plan_one_thread;
      EXPECT_FALSE(plan.planned());
      PagedAttentionArgs args{
          nullptr, nullptr, nullptr, nullptr,     n_heads,      n_kv,
          hd,      stride,  bs,      bs * stride, batch.data(), static_cast<int64_t>(batch.size()),
          scale};
      PlanPagedAttention(args, pool.size(), plan);
      PlanPagedAttention(args, 1, plan_one_thread);
      EXPECT_TRUE(plan.planned());
      for (int layer = 0; layer < 2; ++layer) {
        const uint16_t* kl = layer == 0 ? k.data() : v.data();
        const uint16_t* vl = layer == 0 ? v.data() : k.data();
        std::vector<float> planned(rows * n_heads * hd, 99.0f), other = planned, fresh = planned;
        PagedAttentionCpu(plan, q.data(), kl, vl, planned.data(), pool);
        PagedAttentionCpu(plan_one_thread, q.data(), kl, vl, other.data(), pool);
        args.q = q.data();
        args.k = kl;
        args.v = vl;
        args.out = fresh.data();
        PagedAttentionCpu(args, pool);
        EXPECT_EQ(planned, fresh) << "block size " << bs << ", layer " << layer;
        EXPECT_EQ(other, fresh) << "planned for one thread, block size " << bs;
        if (layer == 0) {
          EXPECT_EQ(planned, together);
        }
      }
      const std::vector<AttentionSeq> one = {{0, seqs[1].tokens, seqs[1].pos0, tb.data()}};
      args.seqs = one.data();
      args.n_seqs = 1;
      const float* q1 = q.data() + batch[1].token0 * n_heads * hd;
      std::vector<float> planned(seqs[1].tokens * n_heads * hd, 99.0f);
      PlanPagedAttention(args, pool.size(), plan);
      PagedAttentionCpu(plan, q1, k.data(), v.data(), planned.data(), pool);
      EXPECT_EQ(planned, run(one, q1, seqs[1].tokens, 2)) << "re-planned, block size " << bs;
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t r0 = batch[i].token0, n = seqs[i].tokens;
      const std::vector<AttentionSeq> one = {{0, n, seqs[i].pos0, seqs[i].table->data()}};
      const auto alone = run(one, q.data() + r0 * n_heads * hd, n, 2);
      const size_t len = static_cast<size_t>(n * n_heads * hd);
      EXPECT_EQ(0,
                std::memcmp(alone.data(), together.data() + r0 * n_heads * hd, len * sizeof(float)))
          << "block size " << bs << ", sequence " << i;
      // Naive reference for this sequence's rows.
      std::vector<double> ref(len);
      std::vector<float> got(together.begin() + r0 * n_heads * hd,
                             together.begin() + r0 * n_heads * hd + len);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < n_heads; ++h) {
          const int64_t kvh = h / 3, keys = seqs[i].pos0 + t + 1;
          auto at = [&](int64_t p) {  // V of position p
            return (*seqs[i].table)[p / bs] * bs * stride + (p % bs) * stride + kvh * hd;
          };
          auto k_at = [&](int64_t p, int64_t x) {  // K (transposed within its block)
            return (*seqs[i].table)[p / bs] * bs * stride + (kvh * hd + x) * bs + p % bs;
          };
          std::vector<double> sc(keys);
          double mx = -1e300, z = 0;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0;
            for (int64_t x = 0; x < hd; ++x) {
              dot += q[((r0 + t) * n_heads + h) * hd + x] * Fp16ToFloat(k[k_at(j, x)]);
            }
            mx = std::max(mx, sc[j] = dot * scale);
          }
          for (auto& e : sc) z += (e = std::exp(e - mx));
          for (int64_t x = 0; x < hd; ++x) {
            double o = 0;
            for (int64_t j = 0; j < keys; ++j) o += sc[j] / z * Fp16ToFloat(v[at(j) + x]);
            ref[(t * n_heads + h) * hd + x] = o;
          }
        }
      }
      EXPECT_LT(RelL2(got, ref), 1e-5) << "block size " << bs << ", sequence " << i;
    }
  }
}

// The lane kernels (heads in vector lanes) against the table's qk_t / exp_shifted_sum / pv, one
// head at a time, to the bit: scores, exps, sums and outputs over chunks of 1 to 64 keys, for
// head counts that fill their vectors and ones that do not, from a record that has seen keys.
TEST_P(IsaTest, LaneAttentionKernelsGiveEachHeadsBits) {
  const auto& p = cpu::Prims();
  if (p.qk_lanes == nullptr) GTEST_SKIP() << "the " << IsaName(GetParam()) << " table has none";
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{48, 64}, {64, 96}, {37, 50}, {5, 3}, {16, 17}, {33, 16}}) {
    const auto src = Randn(rows * (cols + 3), 39);  // a row stride past cols
    std::vector<float> dst((cols + 1) * (rows + 2), -1.0f);
    p.transpose_f32(src.data(), cols + 3, dst.data(), rows + 2, rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(dst[c * (rows + 2) + r], src[r * (cols + 3) + c])
            << "transpose " << rows << " x " << cols << " at " << r << ", " << c;
      }
    }
    EXPECT_EQ(dst[rows], -1.0f) << "wrote past its rows";
  }
  const int64_t d = 64, kc = 64;
  for (const int64_t H : {1, 16, 45, 48, 96, 100}) {
    for (const int64_t n : {64, 37, 1}) {
      const int64_t hs = (H + 15) / 16 * 16;
      const auto q = Randn(H * d, 40 + static_cast<uint32_t>(H), 0.125f);
      std::vector<float> kt(d * kc), vf(kc * d);  // fp16 values, as staged from the cache
      const auto kr = Randn(kt.size(), 41), vr = Randn(vf.size(), 42);
      for (size_t i = 0; i < kt.size(); ++i) kt[i] = Fp16ToFloat(FloatToFp16(kr[i]));
      for (size_t i = 0; i < vf.size(); ++i) vf[i] = Fp16ToFloat(FloatToFp16(vr[i]));
      const auto o0 = Randn(H * d, 43);
      const auto m0 = Randn(H, 44, 0.5f);
      std::vector<float> qt(d * hs, 0.0f), ot(d * hs, 0.0f), st(kc * hs), cmax(hs), sums(hs),
          rescale(hs, 1.0f);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t x = 0; x < d; ++x) {
          qt[x * hs + h] = q[h * d + x];
          ot[x * hs + h] = o0[h * d + x];
        }
      }
      p.qk_lanes(qt.data(), hs, H, d, kt.data(), kc, n, st.data(), cmax.data(), nullptr);
      for (int64_t h = 0; h < H; ++h) cmax[h] = std::max(m0[h], cmax[h]);
      std::vector<float> raw(st);
      p.exp_lanes(st.data(), hs, H, cmax.data(), n, sums.data());
      for (int64_t h = 0; h < H; ++h) rescale[h] = std::exp(m0[h] - cmax[h]);
      p.pv_lanes(st.data(), hs, H, d, vf.data(), n, rescale.data(), ot.data(), nullptr);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> sc(kc), o(d);
        float mx = -std::numeric_limits<float>::infinity();
        p.qk_t(q.data() + h * d, 1, d, kt.data(), kc, n, 1.0f, sc.data(), kc, &mx);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(std::bit_cast<uint32_t>(sc[j]), std::bit_cast<uint32_t>(raw[j * hs + h]))
              << "score, H " << H << " n " << n << " head " << h << " key " << j;
        }
        ASSERT_EQ(std::max(m0[h], mx), cmax[h]) << "maximum, H " << H << " n " << n;
        const float sum = p.exp_shifted_sum(sc.data(), cmax[h], sc.data(), n);
        ASSERT_EQ(std::bit_cast<uint32_t>(sum), std::bit_cast<uint32_t>(sums[h]))
            << "sum, H " << H << " n " << n << " head " << h;
        for (int64_t x = 0; x < d; ++x) o[x] = o0[h * d + x] * rescale[h];
        p.pv(sc.data(), kc, 1, d, vf.data(), n, o.data(), d);
        for (int64_t x = 0; x < d; ++x) {
          ASSERT_EQ(std::bit_cast<uint32_t>(o[x]), std::bit_cast<uint32_t>(ot[x * hs + h]))
              << "output, H " << H << " n " << n << " head " << h << " dim " << x;
        }
      }
    }
  }
}

// Tasks with enough heads run in lanes (16 decode rows over a shared prefix: 48 heads; 32 rows
// of a prefill below the diagonal: 96): each decode row gives its bits alone (one row, no
// lanes), each prefill row its bits in chunks of 8 rows (24 heads, no lanes), and both are near
// a naive softmax.
TEST_P(IsaTest, PagedLaneTasksGiveTheBitsOfOneRowAndOfSmallChunks) {
  // 15 decode rows: 45 heads, a vector not full; head dim 128: no lanes (pv_f16 is no FMA chain
  // there), the same checks.
  // 40 decode rows: one run over the shared keys cut 20 + 20, each task from other sequences'
  // tables.
  for (const auto& [hd, n_dec] :
       {std::pair<int64_t, int64_t>{64, 16}, {64, 15}, {64, 40}, {128, 16}}) {
    const int64_t bs = 16, n_heads = 9, n_kv = 3, stride = n_kv * hd;
    const int64_t prefix = 1100, own = 40, pre_rows = 40, pre_pos0 = 700;
    // Blocks: the shared prefix's, then each decode sequence's own, then the prefill's.
    const int64_t pb = (prefix + bs - 1) / bs, ob = (own + bs) / bs;
    const int64_t fb = (pre_pos0 + pre_rows + bs - 1) / bs;
    const int64_t n_blocks = pb + n_dec * ob + fb;
    std::vector<std::vector<int32_t>> tables(n_dec + 1);
    for (int64_t s = 0; s < n_dec; ++s) {
      for (int64_t b = 0; b < pb; ++b) tables[s].push_back(static_cast<int32_t>(b));
      for (int64_t b = 0; b < ob; ++b) tables[s].push_back(static_cast<int32_t>(pb + s * ob + b));
    }
    for (int64_t b = 0; b < fb; ++b)
      tables[n_dec].push_back(static_cast<int32_t>(pb + n_dec * ob + b));
    const auto kf = Randn(n_blocks * bs * stride, 51), vf = Randn(n_blocks * bs * stride, 52);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    std::vector<AttentionSeq> batch;
    int64_t rows = 0;
    for (int64_t s = 0; s < n_dec; ++s) {
      // Own keys 1..40 in blocks of their own after the shared 69 blocks (positions 0-1103).
      const int64_t keys = pb * bs + 1 + (s * 7) % own;
      batch.push_back({rows++, 1, keys - 1, tables[s].data()});
    }
    batch.push_back({rows, pre_rows, pre_pos0, tables[n_dec].data()});
    rows += pre_rows;
    const auto q = Randn(rows * n_heads * hd, 53, 0.5f);
    const float scale = 0.125f;
    auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows) {
      ThreadPool pool(2);
      std::vector<float> out(n_rows * n_heads * hd, 99.0f);
      PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                         bs * stride, b.data(), static_cast<int64_t>(b.size()), scale},
                        pool);
      return out;
    };
    const int64_t lane_units = PagedAttentionLaneUnits();
    const auto together = run(batch, q.data(), rows);
    if (cpu::Prims().qk_lanes != nullptr && hd == 64) {
      EXPECT_GT(PagedAttentionLaneUnits(), lane_units) << "the batch took no lane path";
    } else {
      EXPECT_EQ(PagedAttentionLaneUnits(), lane_units) << "head dim " << hd;
    }
    const int64_t row_elems = n_heads * hd;
    for (int64_t s = 0; s < n_dec; ++s) {
      const std::vector<AttentionSeq> one = {{0, 1, batch[s].pos0, tables[s].data()}};
      const auto alone = run(one, q.data() + s * row_elems, 1);
      EXPECT_EQ(
          0, std::memcmp(alone.data(), together.data() + s * row_elems, row_elems * sizeof(float)))
          << "decode sequence " << s << ", head dim " << hd << ", " << n_dec << " rows";
    }
    {
      // The 40 prefill rows alone: range 0's rows are cut 20 + 20 (not 32 + 8), so both tasks
      // run in lanes over each of the 3 KV heads; range 1 (the diagonal) does not.
      const std::vector<AttentionSeq> pre = {{0, pre_rows, pre_pos0, tables[n_dec].data()}};
      const int64_t before = PagedAttentionLaneUnits();
      const auto alone = run(pre, q.data() + n_dec * row_elems, pre_rows);
      if (cpu::Prims().qk_lanes != nullptr && hd == 64) {
        EXPECT_EQ(PagedAttentionLaneUnits() - before, 2 * n_kv);
      }
      EXPECT_EQ(0, std::memcmp(alone.data(), together.data() + n_dec * row_elems,
                               pre_rows * row_elems * sizeof(float)))
          << "prefill alone, head dim " << hd;
    }
    // Other prefill lengths over the same blocks: cut evenly only where every task then takes
    // the lanes (34 rows stay 32 + 2, 44 stay 32 + 12: one task in lanes per KV head), and each
    // row's bits those of 2-row calls (6 heads, no lanes).
    for (const auto& [n_pre, lane_tasks] : {std::pair<int64_t, int64_t>{34, 1}, {44, 1}}) {
      if (hd != 64 || n_dec != 16) break;
      const auto qp = Randn(n_pre * row_elems, 54, 0.5f);
      const std::vector<AttentionSeq> pre = {{0, n_pre, pre_pos0, tables[n_dec].data()}};
      const int64_t before = PagedAttentionLaneUnits();
      const auto whole = run(pre, qp.data(), n_pre);
      if (cpu::Prims().qk_lanes != nullptr) {
        EXPECT_EQ(PagedAttentionLaneUnits() - before, lane_tasks * n_kv) << n_pre << " rows";
      }
      for (int64_t r0 = 0; r0 < n_pre; r0 += 2) {
        const std::vector<AttentionSeq> two = {{0, 2, pre_pos0 + r0, tables[n_dec].data()}};
        const auto part = run(two, qp.data() + r0 * row_elems, 2);
        ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + r0 * row_elems,
                                 2 * row_elems * sizeof(float)))
            << n_pre << " prefill rows, rows " << r0 << "-" << r0 + 1;
      }
    }
    for (int64_t r0 = 0; r0 < pre_rows; r0 += 8) {
      const std::vector<AttentionSeq> part = {{0, 8, pre_pos0 + r0, tables[n_dec].data()}};
      const auto chunk = run(part, q.data() + (n_dec + r0) * row_elems, 8);
      EXPECT_EQ(0, std::memcmp(chunk.data(), together.data() + (n_dec + r0) * row_elems,
                               8 * row_elems * sizeof(float)))
          << "prefill rows " << r0 << "-" << r0 + 7 << ", head dim " << hd;
    }
    // Near a naive float64 softmax: decode sequence 5 and prefill row 33.
    for (const auto& [s, t] : {std::pair<int64_t, int64_t>{5, 0}, {n_dec, 33}}) {
      const int64_t row = batch[s].token0 + t, keys = batch[s].pos0 + t + 1;
      std::vector<double> ref(row_elems);
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t kvh = h / 3;
        auto base = [&](int64_t pos) { return tables[s][pos / bs] * bs * stride; };
        std::vector<double> sc(keys);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < hd; ++x) {
            dot += q[row * row_elems + h * hd + x] *
                   Fp16ToFloat(k[base(j) + (kvh * hd + x) * bs + j % bs]);
          }
          mx = std::max(mx, sc[j] = dot * scale);
        }
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (int64_t x = 0; x < hd; ++x) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j) {
            o += sc[j] / z * Fp16ToFloat(v[base(j) + (j % bs) * stride + kvh * hd + x]);
          }
          ref[h * hd + x] = o;
        }
      }
      const std::vector<float> got(together.begin() + row * row_elems,
                                   together.begin() + (row + 1) * row_elems);
      EXPECT_LT(RelL2(got, ref), 1e-5) << "sequence " << s << ", row " << t;
    }
  }
}

// bf16 attention (PagedAttentionArgs::bf16) over a cache of bf16 pairs: a batch gives each
// sequence's bits alone, and the result is near an exact softmax over the cache's bf16 values.
TEST_P(IsaTest, Bf16PagedAttentionMatchesReferenceAndIsBatchInvariant) {
  const int64_t bs = 16, n_heads = 9, n_kv = 3, hd = 64, stride = n_kv * hd;
  const SharedPrefixBatch sb(bs, 5);
  const int64_t n_blocks = sb.n_blocks, rows = sb.rows;
  const auto& seqs = sb.seqs;
  const auto& batch = sb.batch;
  std::vector<uint16_t> k(n_blocks * bs * stride), v(k.size());
  const auto kf = Randn(k.size(), 21), vf = Randn(v.size(), 22);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = cpu::Bf16Of(kf[i]);
    v[i] = cpu::Bf16Of(vf[i]);
  }
  // The pair layout (kernels/ops.h): K's dims 2i, 2i + 1 of a slot side by side, V's slots
  // 2m, 2m + 1 of a dim side by side.
  auto k_at = [&](int32_t block, int64_t h, int64_t x, int64_t slot) {
    return block * bs * stride + (h * hd + (x & ~int64_t{1})) * bs + 2 * slot + (x & 1);
  };
  auto v_at = [&](int32_t block, int64_t slot, int64_t h, int64_t x) {
    return block * bs * stride + (slot & ~int64_t{1}) * stride + 2 * (h * hd + x) + (slot & 1);
  };
  const auto q = Randn(rows * n_heads * hd, 23, 0.5f);
  const float scale = 0.125f;
  auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows, int th) {
    ThreadPool pool(th);
    std::vector<float> out(n_rows * n_heads * hd, 99.0f);
    PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                       bs * stride, b.data(), static_cast<int64_t>(b.size()), scale, 0, 0, 0, true},
                      pool);
    return out;
  };
  const auto together = run(batch, q.data(), rows, 2);
  EXPECT_EQ(together, run(batch, q.data(), rows, 1)) << "thread count changed the bits";
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t r0 = batch[i].token0, n = seqs[i].tokens;
    const size_t len = static_cast<size_t>(n * n_heads * hd);
    const std::vector<AttentionSeq> one = {{0, n, seqs[i].pos0, seqs[i].table->data()}};
    const auto alone = run(one, q.data() + r0 * n_heads * hd, n, 2);
    EXPECT_EQ(0,
              std::memcmp(alone.data(), together.data() + r0 * n_heads * hd, len * sizeof(float)))
        << "sequence " << i;
    // Exact softmax over the bf16 K / V with q rounded to bf16 as the kernel rounds it; what is
    // left is the weights' rounding to bf16 (2^-9 relative each).
    std::vector<double> ref(len);
    const std::vector<float> got(together.begin() + r0 * n_heads * hd,
                                 together.begin() + r0 * n_heads * hd + len);
    const auto& table = *seqs[i].table;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t kvh = h / 3, keys = seqs[i].pos0 + t + 1;
        std::vector<double> sc(keys);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < hd; ++x) {
            const float qs = q[((r0 + t) * n_heads + h) * hd + x] * scale;
            dot += static_cast<double>(cpu::Bf16ToFloat(cpu::Bf16Of(qs))) *
                   cpu::Bf16ToFloat(k[k_at(table[j / bs], kvh, x, j % bs)]);
          }
          mx = std::max(mx, sc[j] = dot);
        }
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (int64_t x = 0; x < hd; ++x) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j) {
            o += sc[j] / z * cpu::Bf16ToFloat(v[v_at(table[j / bs], j % bs, kvh, x)]);
          }
          ref[(t * n_heads + h) * hd + x] = o;
        }
      }
    }
    const double rel = RelL2(got, ref);
    EXPECT_LT(rel, 5e-3) << "sequence " << i;
    EXPECT_GT(rel, 1e-7) << "sequence " << i << ": the weights were not rounded to bf16";
  }
}

TEST(Bf16, RoundsToNearestEvenFlushesTinyAndKeepsNaN) {
  EXPECT_EQ(cpu::Bf16Of(1.0f), 0x3F80);
  EXPECT_EQ(cpu::Bf16Of(-2.0f), 0xC000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1); 1 + 3 * 2^-8 up.
  EXPECT_EQ(cpu::Bf16Of(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(cpu::Bf16Of(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(cpu::Bf16Of(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(cpu::Bf16Of(0x1p-61f), 0x0000);
  EXPECT_EQ(cpu::Bf16Of(-0x1p-61f), 0x8000);
  EXPECT_EQ(cpu::Bf16Of(0x1p-60f), cpu::Bf16Of(0x1p-60f) & 0x7FFF);
  EXPECT_NE(cpu::Bf16Of(0x1p-60f), 0);
  EXPECT_EQ(cpu::Bf16Of(1e-40f), 0) << "subnormal";
  const uint16_t nan = cpu::Bf16Of(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(cpu::Bf16ToFloat(nan)));
  uint32_t sn = 0x7F800001u;  // a signalling NaN whose payload is all below bit 16
  float snf;
  std::memcpy(&snf, &sn, sizeof snf);
  EXPECT_TRUE(std::isnan(cpu::Bf16ToFloat(cpu::Bf16Of(snf))));
  EXPECT_EQ(cpu::Bf16Of(std::numeric_limits<float>::infinity()), 0x7F80);
}

// A pair of bf16 product kernels against the scalar entries, bit for bit (AVX-512: VDPBF16PS or
// fused multiply-adds in the tiles' order; AMX-BF16: the tiles, from 6 heads, in full groups of 16
// and a last partial one), over any head count and odd and even key counts.
void ExpectBf16ProductsMatchScalarReference(const cpu::Bf16Products& p) {
  constexpr int64_t d = 64, kMax = 64;
  std::mt19937 rng(41);
  auto pairs_of = [&](size_t n, float sc) {
    std::vector<uint32_t> out(n);
    const auto lo = Randn(n, rng(), sc), hi = Randn(n, rng(), sc);
    for (size_t i = 0; i < n; ++i)
      out[i] = cpu::Bf16Of(lo[i]) | static_cast<uint32_t>(cpu::Bf16Of(hi[i])) << 16;
    return out;
  };
  for (int64_t G : {1, 3, 6, 7, 12, 16, 19, 48}) {
    for (int64_t n : {1, 2, 15, 16, 31, 32, 33, 63, 64}) {
      // K: 4 groups of 16 keys, each [d / 2][16] inside a 16-slot block (pair stride 16).
      const auto kp = pairs_of(4 * d / 2 * 16, 1.0f);
      const uint32_t* groups[4];
      for (int c = 0; c < 4; ++c) groups[c] = kp.data() + c * d / 2 * 16;
      const auto qp = pairs_of(G * d / 2, 0.2f);
      std::vector<float> s1(G * kMax, 7.0f), s2 = s1, m1(G), m2(G);
      p.qk(qp.data(), G, d, groups, 16, n, s1.data(), kMax, m1.data(), nullptr);
      cpu::GenericQkBf16(qp.data(), G, d, groups, 16, n, s2.data(), kMax, m2.data());
      ASSERT_EQ(s1, s2) << "qk_bf16, G " << G << " n " << n;
      ASSERT_EQ(m1, m2) << "qk_bf16 maximum, G " << G << " n " << n;
      // V: a pair of keys per row, each at its own address; weights with a zero after odd n.
      auto vp = pairs_of((kMax / 2) * d, 1.0f);
      const uint32_t* rows[kMax / 2];
      for (int64_t jp = 0; jp < kMax / 2; ++jp) rows[jp] = vp.data() + (kMax / 2 - 1 - jp) * d;
      auto pp = pairs_of(G * kMax / 2, 0.5f);
      if (n % 2 != 0) {
        for (int64_t g = 0; g < G; ++g) pp[g * kMax / 2 + n / 2] &= 0xFFFFu;
        // Key n (past the end) holds an infinity, as a stale slot might: never read.
        uint32_t* last = vp.data() + (kMax / 2 - 1 - n / 2) * d;
        for (int64_t i = 0; i < d; ++i) last[i] = (last[i] & 0xFFFFu) | 0x7F800000u;
      }
      const auto o0 = Randn(G * (d + 2), rng());
      std::vector<float> o1 = o0, o2 = o0;
      o1[2] = o2[2] = 1e-40f;  // a subnormal accumulator reads as zero
      p.pv(pp.data(), kMax / 2, G, d, rows, n, o1.data() + 2, d + 2, nullptr);
      cpu::GenericPvBf16(pp.data(), kMax / 2, G, d, rows, n, o2.data() + 2, d + 2);
      ASSERT_EQ(o1, o2) << "pv_bf16, G " << G << " n " << n;
      // Head 0 with no weight: its outputs are what it read, so the subnormal accumulators
      // (either sign) must come back as zero (and equal the reference's).
      auto pz = pp;
      std::fill_n(pz.begin(), kMax / 2, 0u);
      std::vector<float> z1 = o0;
      z1[2] = 1e-40f;
      z1[3] = -1e-40f;
      std::vector<float> z2 = z1;
      p.pv(pz.data(), kMax / 2, G, d, rows, n, z1.data() + 2, d + 2, nullptr);
      cpu::GenericPvBf16(pz.data(), kMax / 2, G, d, rows, n, z2.data() + 2, d + 2);
      ASSERT_EQ(z1, z2) << "pv_bf16 without weights, G " << G << " n " << n;
      ASSERT_EQ(z1[2], 0.0f) << "a subnormal accumulator was not read as zero";
      ASSERT_EQ(z1[3], 0.0f) << "a subnormal accumulator was not read as zero";
    }
  }
}

TEST_P(IsaTest, Bf16ProductsMatchScalarReference) {
  ExpectBf16ProductsMatchScalarReference({cpu::Prims().qk_bf16, cpu::Prims().pv_bf16});
}

// Both AVX-512 kernels, whichever the table took: the fused multiply-adds (every AVX-512 CPU's
// fallback) and VDPBF16PS (two chain steps an instruction, where the CPU has it).
TEST(Bf16, EveryAvx512KernelMatchesScalarReference) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  {
    SCOPED_TRACE("fused multiply-adds");
    ExpectBf16ProductsMatchScalarReference(cpu::Avx512FmaBf16());
  }
  if (!cpu::CpuHasDpBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  SCOPED_TRACE("VDPBF16PS");
  ExpectBf16ProductsMatchScalarReference(cpu::Avx512DpBf16());
  // The table's start-up check passed and the table took them (a failed check would leave the
  // fused multiply-adds in use silently).
  ASSERT_TRUE(cpu::DpBf16Usable()) << "VDPBF16PS kernels disagree with the reference here";
  EXPECT_EQ(cpu::Avx512Primitives().qk_bf16, cpu::Avx512DpBf16().qk);
  EXPECT_EQ(cpu::Avx512Primitives().pv_bf16, cpu::Avx512DpBf16().pv);
}

TEST_P(IsaTest, Bf16ConversionMatchesReference) {
  const auto& p = cpu::Prims();
  std::vector<float> x = Randn(1000, 31, 3.0f);
  std::mt19937 rng(32);
  for (int i = 0; i < 1000; ++i) {  // any bit pattern
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1e-40f, -1e-40f, 0x1p-60f, 0x1p-61f, 1.0f + 0x1p-8f, 3.4e38f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(f);
  std::vector<uint16_t> got(x.size());
  p.to_bf16(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], cpu::Bf16Of(x[i])) << "element " << i;
}

// The AVX-512 table has its own bf16 entries (not the scalar ones), and where the CPU has AMX-BF16
// the AMX table runs them on tiles.
TEST(Bf16, VectorAndTileKernelsInUseWhereTheCpuHasThem) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  EXPECT_NE(cpu::Avx512Primitives().qk_bf16, &cpu::GenericQkBf16);
  EXPECT_NE(cpu::Avx512Primitives().pv_bf16, &cpu::GenericPvBf16);
  if (!cpu::AmxBf16Usable()) GTEST_SKIP() << "this CPU has no AMX-BF16 (or the OS refused AMX)";
  EXPECT_NE(cpu::AmxPrimitives().qk_bf16, cpu::Avx512Primitives().qk_bf16);
  EXPECT_NE(cpu::AmxPrimitives().pv_bf16, cpu::Avx512Primitives().pv_bf16);
  EXPECT_GT(cpu::AmxPrimitives().pair_heads_bf16, cpu::Avx512Primitives().pair_heads_bf16);
}

// Where the CPU has AMX-INT8 and Linux grants the tile state, the detected level is amx and its
// table runs the packed products on tiles (not the AVX-512 kernel under another name).

}  // namespace
}  // namespace kvmesh::kernels
