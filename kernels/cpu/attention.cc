#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {

namespace {

constexpr int64_t kKeyChunk = 64;          // scores kept per step of the online softmax
constexpr int64_t kMinKeysPerSplit = 256;  // below this, splitting keys costs more than it saves

// Online-softmax state of one query head over a range of keys: running max m, running sum l of
// exp(s - m), and the unnormalised output o (head_dim floats, stored after the struct).
struct Partial {
  float m, l;
};

// Attends the `group` query heads q[g * d ...] of one KV head to keys [j_begin, j_end).
// Writes one (Partial, o[d]) record per query head into `out` (stride 2 + d floats).
void AttendRange(const AttentionArgs& a, const cpu::Primitives& p, const float* q, int64_t group,
                 const uint16_t* kbase, const uint16_t* vbase, int64_t j_begin, int64_t j_end,
                 float* out) {
  const int64_t d = a.head_dim;
  const int64_t rec = 2 + d;
  thread_local std::vector<float> score_buf;  // this thread's [group, kKeyChunk] scores
  score_buf.resize(static_cast<size_t>(group * kKeyChunk));
  auto scores = [&](int64_t g) { return score_buf.data() + g * kKeyChunk; };
  for (int64_t g = 0; g < group; ++g) {
    float* r = out + g * rec;
    r[0] = -std::numeric_limits<float>::infinity();
    r[1] = 0.0f;
    std::fill(r + 2, r + 2 + d, 0.0f);
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyChunk) {
    const int64_t n = std::min(kKeyChunk, j_end - j0);
    p.qk(q, group, d, kbase + j0 * a.kv_pos_stride, a.kv_pos_stride, n, a.scale, scores(0),
         kKeyChunk);
    for (int64_t g = 0; g < group; ++g) {
      float* r = out + g * rec;
      float cmax = r[0];
      for (int64_t j = 0; j < n; ++j) cmax = std::max(cmax, scores(g)[j]);
      // Rescale what was accumulated under the old max, once per chunk.
      const float rescale = std::exp(r[0] - cmax);
      r[0] = cmax;
      p.exp_shifted(scores(g), cmax, scores(g), n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += scores(g)[j];
      r[1] = r[1] * rescale + sum;
      if (rescale != 1.0f) {
        for (int64_t i = 0; i < d; ++i) r[2 + i] *= rescale;
      }
    }
    // V: each row is loaded once for all heads of the group.
    p.pv(scores(0), kKeyChunk, group, d, vbase + j0 * a.kv_pos_stride, a.kv_pos_stride, n, out + 2,
         rec);
  }
}

}  // namespace

void AttentionCpu(const AttentionArgs& a, ThreadPool& pool) {
  const auto& p = cpu::Prims();
  const int64_t group = a.group > 0 ? a.group : a.n_heads / a.n_kv_heads;
  const int64_t d = a.head_dim;
  const int64_t rec = 2 + d;
  // Local query heads [first, last) of local KV head kvh.
  auto heads_of = [&](int64_t kvh) {
    const int64_t g = a.kv_head0 + kvh;
    const int64_t first = std::max(a.q_head0, g * group) - a.q_head0;
    const int64_t last = std::min(a.q_head0 + a.n_heads, (g + 1) * group) - a.q_head0;
    return std::pair<int64_t, int64_t>{first, last};
  };
  // Work units are (token, kv head, key split). Decode has few (token, kv head) pairs, so the
  // keys are split across threads (flash-decoding) and the partial softmaxes merged after.
  const int64_t pairs = a.tokens * a.n_kv_heads;
  const int64_t max_keys = a.pos0 + a.tokens;
  int64_t splits = 1;
  if (pairs < 4 * pool.size()) {
    splits = std::clamp<int64_t>((4 * pool.size() + pairs - 1) / pairs, 1,
                                 std::max<int64_t>(1, max_keys / kMinKeysPerSplit));
  }
  thread_local std::vector<float> scratch_storage;
  std::vector<float>& scratch = scratch_storage;  // workers reach it through this reference
  if (splits > 1) scratch.resize(static_cast<size_t>(pairs * splits * group * rec));
  pool.ParallelFor(pairs * splits, 1, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> local;  // this worker's records when keys are not split
    local.resize(static_cast<size_t>(group * rec));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t pair = u / splits, s = u % splits;
      const int64_t t = pair / a.n_kv_heads, kvh = pair % a.n_kv_heads;
      const auto [h0, h1] = heads_of(kvh);
      if (h1 <= h0) continue;
      const int64_t n_keys = a.pos0 + t + 1;
      const int64_t j_begin = n_keys * s / splits, j_end = n_keys * (s + 1) / splits;
      const float* q = a.q + (t * a.n_heads + h0) * d;
      float* rec_out = splits > 1 ? scratch.data() + u * group * rec : local.data();
      AttendRange(a, p, q, h1 - h0, a.k + kvh * d, a.v + kvh * d, j_begin, j_end, rec_out);
      if (splits == 1) {
        for (int64_t g = 0; g < h1 - h0; ++g) {
          const float* r = rec_out + g * rec;
          float* o = a.out + (t * a.n_heads + h0 + g) * d;
          const float inv = 1.0f / r[1];
          for (int64_t i = 0; i < d; ++i) o[i] = r[2 + i] * inv;
        }
      }
    }
  });
  if (splits == 1) return;
  // Merge the splits of each (token, head): rescale every partial to the common max.
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t t = pair / a.n_kv_heads, kvh = pair % a.n_kv_heads;
    const auto [h0, h1] = heads_of(kvh);
    for (int64_t g = 0; g < h1 - h0; ++g) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < splits; ++s) {
        m = std::max(m, scratch[((pair * splits + s) * group + g) * rec]);
      }
      float* o = a.out + (t * a.n_heads + h0 + g) * d;
      std::fill(o, o + d, 0.0f);
      float l = 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        const float* r = scratch.data() + ((pair * splits + s) * group + g) * rec;
        if (r[1] == 0.0f) continue;  // an empty split
        const float w = std::exp(r[0] - m);
        l += r[1] * w;
        for (int64_t i = 0; i < d; ++i) o[i] += r[2 + i] * w;
      }
      const float inv = 1.0f / l;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
    }
  }
}

}  // namespace kvmesh::kernels
