#include "serving/router.h"

namespace kvmesh::serving {

int ChooseReplica(std::span<const ReplicaLoad> replicas, int64_t prompt_tokens,
                  const RoutePolicy& policy) {
  const int n = static_cast<int>(replicas.size());
  bool any_room = false;
  for (const ReplicaLoad& r : replicas) any_room |= !r.queue_full;
  auto eligible = [&](int i) { return !any_room || !replicas[i].queue_full; };
  // Visiting from policy.turn, a strict comparison leaves full ties to the first one visited.
  int least = -1;
  for (int k = 0; k < n; ++k) {
    const int i = static_cast<int>((policy.turn + k) % n);
    if (!eligible(i)) continue;
    const ReplicaLoad& r = replicas[i];
    if (least < 0 || r.load < replicas[least].load ||
        (r.load == replicas[least].load && r.pool_blocks < replicas[least].pool_blocks)) {
      least = i;
    }
  }
  // The longest known prefix among the replicas less than a batch busier than the least loaded.
  int best = least;
  for (int i = 0; i < n; ++i) {
    const ReplicaLoad& r = replicas[i];
    if (!eligible(i) || r.load - replicas[least].load >= policy.max_imbalance) continue;
    if (r.known_tokens > replicas[best].known_tokens ||
        (r.known_tokens == replicas[best].known_tokens && r.load < replicas[best].load)) {
      best = i;
    }
  }
  const int64_t known = replicas[best].known_tokens;
  const bool decides =
      known >= policy.min_tokens && known > 0 &&
      static_cast<double>(known) >= policy.min_share * static_cast<double>(prompt_tokens);
  return decides ? best : least;
}

}  // namespace kvmesh::serving
