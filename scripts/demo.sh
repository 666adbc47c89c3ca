#!/usr/bin/env bash
# The kvmesh main job, end to end on this machine: install and build, fetch the model, start a
# two-rank tensor-parallel cluster (`launch/local.sh`: mpirun -np 2 kvmesh serve --tp 2), hold
# a three-turn conversation over a ~1,300-token document and send two independent requests on
# the same document through the OpenAI-compatible HTTP API, printing each answer, its time to
# first token and the prompt tokens served from the KV cache, and the prefix-cache counters from
# /metrics; then shut the cluster down (SIGTERM to the coordinator).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
model="$(scripts/model_pull.sh)"
log="$(mktemp)"
# On a failure, SIGTERM lets mpirun take its ranks down with it; SIGKILL only if it lingers.
stop_cluster() {
  [[ -n "${cluster:-}" ]] || return 0
  kill -TERM "$cluster" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$cluster" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$cluster" 2>/dev/null || true
}
trap 'rm -f "$log"; stop_cluster' EXIT

echo "== launch/local.sh: mpirun -np 2 kvmesh serve --tp 2 (rank 0 coordinates, both ranks compute)" >&2
TP=2 launch/local.sh --model "$model" --port 0 --rpc-port 0 >"$log" 2>&1 &
cluster=$!
port=""
for _ in $(seq 1 600); do
  port="$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -n1 | sed 's/.*://')" || true
  [[ -n "$port" ]] && break
  kill -0 "$cluster" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$port" ]] || { echo "the cluster did not start" >&2; cat "$log" >&2; exit 1; }
cat "$log" >&2

python3 scripts/demo_client.py "http://127.0.0.1:$port"

# Shut down: SIGTERM to rank 0 (this cluster's: among mpirun's children), which drains, stops
# the workers and exits; mpirun follows.
rank0=""
for pid in $(pgrep -P "$cluster" || true); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then
    rank0=$pid
  fi
done
[[ -n "$rank0" ]] || { echo "rank 0 of the cluster (mpirun pid $cluster) not found" >&2; exit 1; }
kill -TERM "$rank0"
for _ in $(seq 1 600); do kill -0 "$cluster" 2>/dev/null || break; sleep 0.1; done
kill -0 "$cluster" 2>/dev/null && { echo "the cluster did not stop within 60 s of SIGTERM" >&2; exit 1; }
wait "$cluster"
cluster=""
grep -h "kvmesh: stopped" "$log" >&2 || true
