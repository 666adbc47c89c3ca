#!/usr/bin/env bash
# A real single-node Slurm (slurmctld + slurmd + munged, configured in a temporary directory with
# proctrack/linuxproc and task/none, private ports): submits launch/slurm/kvmesh.sbatch (tp = 2,
# srun --mpi=pmix), talks to the server over HTTP, cancels the job with scancel and checks that
# rank 0 drained and stopped cleanly. Skipped, with the reason, where Slurm or munge is not
# installed or the daemons cannot start (not root).
# Usage: slurm_test.sh KVMESH_BINARY
set -uo pipefail
bin="$(realpath "$1")"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
model="${KVMESH_MODEL:-${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf}"
skip() { echo "SKIP: $*"; exit 77; }
[[ -f "$model" ]] || skip "model not pulled ($model)"
for t in slurmctld slurmd munged sbatch scancel; do
  command -v "$t" >/dev/null || [[ -x "/usr/sbin/$t" ]] || skip "$t not installed (Debian: slurm-wlm munge)"
done
[[ "$(id -u)" == 0 ]] || skip "the test runs slurmd and munged as root"
PATH="$PATH:/usr/sbin"
work="$(mktemp -d)"
cleanup() {
  # Jobs first (their processes outlive the daemons), then the daemons.
  [[ -n "${job:-}" ]] && scancel "$job" >/dev/null 2>&1 && sleep 1
  [[ -n "${job:-}" ]] && pkill -9 -f -- "--port $port --rpc-port" 2>/dev/null
  [[ -n "${SLURM_CONF:-}" ]] && scontrol shutdown >/dev/null 2>&1
  for p in "${daemons[@]:-}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${daemons[@]:-}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
daemons=()
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -n 20 "$work"/log/* "$work"/job.log >&2 2>/dev/null
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mkdir -p "$work"/{munge,state,spool,log,tmp}
head -c 1024 /dev/urandom >"$work/munge/munge.key"
chmod 700 "$work/munge"
chmod 400 "$work/munge/munge.key"
munged -f --socket="$work/munge/sock" --key-file="$work/munge/munge.key" \
  --log-file="$work/log/munged.log" --pid-file="$work/munge/pid" --seed-file="$work/munge/seed" ||
  skip "munged cannot start: $(tail -n 2 "$work/log/munged.log" 2>/dev/null)"
daemons+=("$(cat "$work/munge/pid")")
host="$(hostname)"
cat >"$work/slurm.conf" <<CONF
ClusterName=kvmeshtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
TmpFS=$work/tmp
FirstJobId=$((1000 + RANDOM))
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -D -f "$SLURM_CONF" >"$work/log/ctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/log/d.out" 2>&1 &
daemons+=($!)
for _ in $(seq 1 100); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %T 2>/dev/null | grep -q idle || skip "slurmd did not come up: $(tail -n 3 "$work/log/slurmd.log" 2>/dev/null)"

port="$(free_port)"
job=""
job="$(cd "$repo" && TP=2 KVMESH_BIN="$bin" KVMESH_MODEL="$model" KVMESH_PORT="$port" \
  KVMESH_RPC_PORT="$(free_port)" \
  sbatch --parsable -n 2 -o "$work/job.log" launch/slurm/kvmesh.sbatch)" || fail "sbatch"
for _ in $(seq 1 600); do
  grep -q "kvmesh: serving" "$work/job.log" 2>/dev/null && break
  [[ "$(squeue -h -j "$job" -o %T 2>/dev/null)" == "" ]] && fail "job $job ended early"
  sleep 0.1
done
grep -q "world 2, dp 1, tp 2" "$work/job.log" || fail "server not up under Slurm"
python3 - "http://127.0.0.1:$port" <<'PY' || fail "HTTP through the Slurm job"
import json, sys, urllib.request
body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 16}
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", method="POST",
                             data=json.dumps(body).encode())
r = json.loads(urllib.request.urlopen(req, timeout=60).read())
assert "Paris" in r["choices"][0]["message"]["content"], r
print("slurm: answer through the job:", r["choices"][0]["message"]["content"])
PY
scancel "$job" || fail "scancel"
for _ in $(seq 1 300); do
  [[ -z "$(squeue -h -j "$job" 2>/dev/null)" ]] && break
  sleep 0.1
done
[[ -z "$(squeue -h -j "$job" 2>/dev/null)" ]] || fail "job $job still running 30 s after scancel"
grep -q "kvmesh: stopped" "$work/job.log" || fail "rank 0 did not drain and stop cleanly"
sed "s/^/slurm: job log: /" "$work/job.log"
echo "slurm: sbatch (srun --mpi=pmix, tp = 2) served, scancel stopped it cleanly"
