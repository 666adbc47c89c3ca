#!/usr/bin/env bash
# Parallel scaling on this machine at a fixed total core count (2 by default):
#  - one sequence: prefill (512-token prompt) and decode (128 tokens) tokens/s for (tp, pp) in
#    (1,1) (1 rank x 2 threads), (2,1) (2 ranks x 1 thread), (1,2) (2 stages x 1 thread) and
#    (3,1) (3 ranks x 1 thread, oversubscribed);
#  - concurrent sequences (--batch, 4 by default, 128 tokens each): decode tokens/s of the
#    serving engine for (1,1), (2,1) and (1,2), where pipeline stages overlap steps;
#  - TP communication per decode step on the leader, split into waiting for the slowest rank
#    and transfer (arrival stamps, see worker::CommStats), for the shared-memory and the MPI
#    collectives, against bare MPI_Allreduce / MPI_Gatherv latencies of the same sizes
#    (bench/allreduce_bench, hot loop after a barrier: the local physical limit).
#   bench/scaling.sh [--model PATH] [--cores 2] [--reps 3] [--batch 4]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/bin/kvmesh"
model="${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf"
cores=2
reps=3
batch=4
while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    *) echo "scaling: unknown argument $1" >&2; exit 2 ;;
  esac
done
mpi=(mpirun --oversubscribe --bind-to none)
[[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
prompt="$(python3 -c "print(' '.join(['The cluster stores the key blocks of a long context before the next step.'] * 37))")"
python3 - "$out/prompts.json" "$batch" <<'PY'
import json, sys
topics = ["the sea", "a cat", "rain", "copper", "a library", "the moon", "bread", "a river"]
json.dump([f"Write a long story about {topics[i % len(topics)]}." for i in range(int(sys.argv[2]))],
          open(sys.argv[1], "w"))
PY

launch() {  # launch TP PP THREADS -- kvmesh run args
  local tp="$1" pp="$2" threads="$3"; shift 4
  if [[ "$tp" == 1 && "$pp" == 1 ]]; then
    "$bin" run --model "$model" --threads "$threads" --temperature 0 "$@"
  else
    "${mpi[@]}" -np "$((tp * pp))" "$bin" run --tp "$tp" --pp "$pp" --model "$model" \
      --threads "$threads" --temperature 0 "$@"
  fi
}
half=$((cores / 2 > 0 ? cores / 2 : 1))
# Configurations interleaved rep by rep, so a slow spell of the machine hits all of them.
for r in $(seq 1 "$reps"); do
  for cfg in "1 1 $cores" "2 1 $half" "1 2 $half" "3 1 1"; do
    read -r tp pp threads <<<"$cfg"
    echo "rep $r: tp=$tp pp=$pp threads/rank=$threads" >&2
    launch "$tp" "$pp" "$threads" -- --json --prompt "$prompt" --max-tokens 1 >>"$out/prefill.$tp.$pp.jsonl"
    launch "$tp" "$pp" "$threads" -- --json --prompt "Hello" --max-tokens 128 --ignore-eos \
      >>"$out/decode.$tp.$pp.jsonl"
  done
  launch 2 1 "$half" -- --json --prompt "Hello" --max-tokens 128 --ignore-eos \
    --tp-collectives mpi >>"$out/decode.2.1.mpi.jsonl"
  for cfg in "1 1 $cores" "2 1 $half" "1 2 $half"; do
    read -r tp pp threads <<<"$cfg"
    launch "$tp" "$pp" "$threads" -- --prompts "$out/prompts.json" --max-tokens 128 --ignore-eos \
      2>&1 >/dev/null | grep -o '[0-9.]* tokens/s' >>"$out/batch.$tp.$pp.txt"
  done
done
for tp in 2 3; do
  "${mpi[@]}" -np "$tp" "$root/build/bin/allreduce_bench" >"$out/bare.$tp.json"
done

python3 - "$out" "$cores" "$batch" <<'PY'
import json, statistics as st, sys
out, cores, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(tag):
    return [json.loads(l) for l in open(f"{out}/{tag}.jsonl") if l.strip()]
med = st.median
print(f"total cores: {cores}; model: SmolLM2-135M-Instruct Q4_1; medians of runs")
print("\nOne sequence (prefill: 512-token prompt; decode: 128 tokens):\n")
print("| tp | pp | ranks x threads | prefill t/s | vs (1,1) | decode t/s | vs (1,1) |")
print("|----|----|-----------------|-------------|----------|------------|----------|")
base = {}
for tp, pp in ((1, 1), (2, 1), (1, 2), (3, 1)):
    p = med(r["prefill_tokens_per_s"] for r in load(f"prefill.{tp}.{pp}"))
    d = med(r["decode_tokens_per_s"] for r in load(f"decode.{tp}.{pp}"))
    th = load(f"prefill.{tp}.{pp}")[0]["threads"]
    base = base or {"p": p, "d": d}
    print(f"| {tp} | {pp} | {tp*pp} x {th} | {p:.1f} | {p/base['p']:.2f} | {d:.1f} | {d/base['d']:.2f} |")
print(f"\n{batch} concurrent sequences (serving engine, 128 tokens each):\n")
print("| tp | pp | decode t/s (all sequences) | vs (1,1) |")
print("|----|----|----------------------------|----------|")
b0 = None
for tp, pp in ((1, 1), (2, 1), (1, 2)):
    v = med(float(l.split()[0]) for l in open(f"{out}/batch.{tp}.{pp}.txt"))
    b0 = b0 or v
    print(f"| {tp} | {pp} | {v:.1f} | {v/b0:.2f} |")
bare = {tp: json.load(open(f"{out}/bare.{tp}.json")) for tp in (2, 3)}
print("\nTP communication per decode step on the leader (us; 60 all-reduces + 1 logits gather):\n")
print("| tp | collectives | in the calls | waiting for the slowest rank | transfer | bare MPI | transfer / bare | all-reduce transfer per call | bare per call | share of decode run in the calls |")
print("|----|-------------|--------------|------------------------------|----------|----------|-----------------|------------------------------|---------------|----------------------------------|")
for tp, coll, tag in ((2, "shm", "decode.2.1"), (2, "mpi", "decode.2.1.mpi"), (3, "shm", "decode.3.1")):
    runs = load(tag)
    steps = lambda r: max(1, len(r["tokens"]))
    inc = med((r["allreduce_ms"] + r["gather_ms"]) * 1e3 / steps(r) for r in runs)
    wait = med((r["allreduce_wait_ms"] + r["gather_wait_ms"]) * 1e3 / steps(r) for r in runs)
    xfer = med((r["allreduce_ms"] - r["allreduce_wait_ms"] + r["gather_ms"] - r["gather_wait_ms"]) * 1e3 / steps(r) for r in runs)
    per = med((r["allreduce_ms"] - r["allreduce_wait_ms"]) * 1e3 / max(1, r["allreduces"]) for r in runs)
    share = med(r["comm_ms"] / (r["prefill_ms"] + r["decode_ms"]) for r in runs)
    b = bare[tp]
    bare_step = 60 * b["allreduce_decode_us"] + b["gather_logits_us"]
    print(f"| {tp} | {coll} | {inc:.1f} | {wait:.1f} | {xfer:.1f} | {bare_step:.1f} | {xfer/bare_step:.2f} | {per:.2f} | {b['allreduce_decode_us']:.2f} | {100*share:.1f}% |")
for tp in (2, 3):
    b = bare[tp]
    print(f"\nbare MPI, {tp} ranks: allreduce {b['n_embd']} floats {b['allreduce_decode_us']:.2f} us, "
          f"{b['n_embd']}x{b['prefill_tokens']} floats {b['allreduce_prefill_us']:.1f} us, logits gather {b['gather_logits_us']:.2f} us")
PY
