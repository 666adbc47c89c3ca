// Where a rank's forward passes spend their wall time, by phase: the QKV product, rotary and
// KV-cache writes, attention, the output projection, the MLP's two products and the LM head,
// summed since the forward was built. Opt-in (EngineOptions::phase_times; off, nothing is read
// from the clock): it answers "where does a decode step go" inside the real engine, with its
// real KV layout, batch and thread pool, where a kernel benchmark only sees one part alone.
// A phase's time includes its work on every pool thread (they join at its end) and the element-
// wise steps folded into it (the norms run inside the products' quantisation pass).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace kvmesh::worker {

enum class Phase : int {
  kQkv,        // the attention norm, Q/K/V products
  kRope,       // rotary embedding, K/V written into the cache blocks
  kAttention,  // paged attention (its plan, made once per batch, is in kOther)
  kOProj,      // the output projection and its TP all-reduce
  kGateUp,     // the MLP norm, gate and up products
  kDown,       // SwiGLU, the down product and its TP all-reduce
  kLmHead,     // the final norm, the LM head and the logits' gather / send
  kOther,      // the rest: validation, embeddings, pipeline transfers
  kCount,
};
inline constexpr int kPhases = static_cast<int>(Phase::kCount);

// The Prometheus-style label of a phase ("qkv", "rope", ...).
const char* PhaseName(Phase p);

struct PhaseTimes {
  std::array<double, kPhases> seconds{};
  int64_t forwards = 0;  // Forward calls counted
  double operator[](Phase p) const { return seconds[static_cast<int>(p)]; }
  double total() const;
  // This minus an earlier snapshot of the same totals (a window of steps).
  PhaseTimes Since(const PhaseTimes& earlier) const;
  // Adds another window's times and forwards (windows summed over repetitions).
  PhaseTimes& operator+=(const PhaseTimes& other);
};

// Adds the time since the previous mark to a phase of `times` (null: does nothing, reads no
// clock). One per Forward call, on the calling thread.
class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes* times) : times_(times) {
    if (times_ != nullptr) last_ = std::chrono::steady_clock::now();
  }
  // The time since the previous mark (or construction) was phase p's.
  void Mark(Phase p) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    times_->seconds[static_cast<int>(p)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  PhaseTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace kvmesh::worker
