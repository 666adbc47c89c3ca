#!/usr/bin/env bash
# Starts a kvmesh cluster on this machine: `mpirun -np TP*PP kvmesh serve --tp TP --pp PP ...`
# (one process when TP*PP = 1). Extra arguments go to `kvmesh serve`. Runs in the foreground;
# stop it with SIGTERM to rank 0 (its pid is written to $KVMESH_RANK0_PID_FILE when set) or
# Ctrl-C. Environment:
#   KVMESH_BIN   the kvmesh binary (default: build/bin/kvmesh)
#   TP, PP       tensor / pipeline parallel sizes (default 2 and 1)
#   THREADS      threads per rank (default: cores / ranks, at least 1)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${KVMESH_BIN:-build/bin/kvmesh}"
tp="${TP:-2}"
pp="${PP:-1}"
np=$((tp * pp))
threads="${THREADS:-$(($(nproc) / np > 0 ? $(nproc) / np : 1))}"
args=(serve --tp "$tp" --pp "$pp" --threads "$threads" "$@")
if ((np == 1)); then
  exec "$bin" "${args[@]}"
fi
mpi=(mpirun --oversubscribe --bind-to none -np "$np")
[[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
exec "${mpi[@]}" "$bin" "${args[@]}"
