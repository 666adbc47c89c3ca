#include "worker/phase_times.h"

namespace kvmesh::worker {

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kQkv:
      return "qkv";
    case Phase::kRope:
      return "rope";
    case Phase::kAttention:
      return "attention";
    case Phase::kOProj:
      return "o_proj";
    case Phase::kGateUp:
      return "gate_up";
    case Phase::kDown:
      return "down";
    case Phase::kLmHead:
      return "lm_head";
    case Phase::kOther:
    case Phase::kCount:
      break;
  }
  return "other";
}

double PhaseTimes::total() const {
  double t = 0;
  for (const double s : seconds) t += s;
  return t;
}

PhaseTimes PhaseTimes::Since(const PhaseTimes& earlier) const {
  PhaseTimes d;
  for (int i = 0; i < kPhases; ++i) d.seconds[i] = seconds[i] - earlier.seconds[i];
  d.forwards = forwards - earlier.forwards;
  return d;
}

PhaseTimes& PhaseTimes::operator+=(const PhaseTimes& other) {
  for (int i = 0; i < kPhases; ++i) seconds[i] += other.seconds[i];
  forwards += other.forwards;
  return *this;
}

}  // namespace kvmesh::worker
