#!/usr/bin/env bash
# Starts a kvmesh cluster on this machine: `mpirun -np DP*TP*PP kvmesh serve --dp DP --tp TP
# --pp PP ...` (one process when that is 1). Extra arguments go to `kvmesh serve`; relative paths
# in them are taken from the directory it is run in. Runs in the foreground; stop it with SIGTERM
# to rank 0 (the process with OMPI_COMM_WORLD_RANK=0 among mpirun's children) or Ctrl-C.
# Environment:
#   KVMESH_BIN   the kvmesh binary (default: this repository's build/bin/kvmesh)
#   DP, TP, PP   data / tensor / pipeline parallel sizes (default 1, 2 and 1)
#   THREADS      threads per rank (default: cores / ranks, at least 1)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${KVMESH_BIN:-$repo/build/bin/kvmesh}"
dp="${DP:-1}"
tp="${TP:-2}"
pp="${PP:-1}"
np=$((dp * tp * pp))
threads="${THREADS:-$(($(nproc) / np > 0 ? $(nproc) / np : 1))}"
args=(serve --dp "$dp" --tp "$tp" --pp "$pp" --threads "$threads" "$@")
if ((np == 1)); then
  exec "$bin" "${args[@]}"
fi
mpi=(mpirun --oversubscribe --bind-to none -np "$np")
[[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
exec "${mpi[@]}" "$bin" "${args[@]}"
