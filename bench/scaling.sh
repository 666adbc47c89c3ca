#!/usr/bin/env bash
# Parallel scaling on this machine at a fixed total core count (2 by default): prefill and
# decode tokens/s of one sequence for (tp, pp) in (1,1) (1 rank x 2 threads), (2,1) (2 ranks x 1
# thread), (1,2) (2 stages x 1 thread) and (3,1) (3 ranks x 1 thread, oversubscribed); the
# share of the decode run spent in TP collectives; and the TP communication per decode step
# against bare MPI_Allreduce / MPI_Gatherv latencies of the same sizes (bench/allreduce_bench).
#   bench/scaling.sh [--model PATH] [--cores 2] [--reps 3]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/bin/kvmesh"
model="${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf"
cores=2
reps=3
while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    *) echo "scaling: unknown argument $1" >&2; exit 2 ;;
  esac
done
mpi=(mpirun --oversubscribe --bind-to none)
[[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
prompt="$(python3 -c "print(' '.join(['The cluster stores the key blocks of a long context before the next step.'] * 37))")"

run() {  # run TP PP THREADS TAG -- extra args
  local tp="$1" pp="$2" threads="$3" tag="$4"; shift 5
  for r in $(seq 1 "$reps"); do
    if [[ "$tp" == 1 && "$pp" == 1 ]]; then
      "$bin" run --model "$model" --threads "$threads" --temperature 0 --json "$@"
    else
      "${mpi[@]}" -np $((tp * pp)) "$bin" run --tp "$tp" --pp "$pp" --model "$model" \
        --threads "$threads" --temperature 0 --json "$@"
    fi
  done >"$out/$tag.jsonl"
}
half=$((cores / 2 > 0 ? cores / 2 : 1))
for cfg in "1 1 $cores" "2 1 $half" "1 2 $half" "3 1 1"; do
  read -r tp pp threads <<<"$cfg"
  echo "tp=$tp pp=$pp threads/rank=$threads" >&2
  run "$tp" "$pp" "$threads" "prefill.$tp.$pp" -- --prompt "$prompt" --max-tokens 1
  run "$tp" "$pp" "$threads" "decode.$tp.$pp" -- --prompt "Hello" --max-tokens 128 --ignore-eos
done
for tp in 2 3; do
  "${mpi[@]}" -np "$tp" "$root/build/bin/allreduce_bench" >"$out/bare.$tp.json"
done

python3 - "$out" "$cores" <<'PY'
import json, statistics, sys
out, cores = sys.argv[1], int(sys.argv[2])
def load(tag):
    return [json.loads(l) for l in open(f"{out}/{tag}.jsonl") if l.strip()]
rows, base = [], {}
for tp, pp in ((1, 1), (2, 1), (1, 2), (3, 1)):
    pre, dec = load(f"prefill.{tp}.{pp}"), load(f"decode.{tp}.{pp}")
    p_ts = statistics.median(r["prefill_tokens_per_s"] for r in pre)
    d_ts = statistics.median(r["decode_tokens_per_s"] for r in dec)
    steps = [len(r["tokens"]) - 1 for r in dec]
    # Communication per decode step: the decode run's collectives less its one prefill step.
    # TP collectives per decode step (leader's view; pipeline sends are not counted here).
    comm_step_us = statistics.median(
        (r["comm_ms"] * 1e3) / max(1, len(r["tokens"])) for r in dec) if tp > 1 else 0.0
    share = statistics.median(r["comm_ms"] / (r["prefill_ms"] + r["decode_ms"]) for r in dec) if tp > 1 else 0.0
    if (tp, pp) == (1, 1):
        base = {"p": p_ts, "d": d_ts}
    bare = json.load(open(f"{out}/bare.{tp}.json")) if tp > 1 else None
    bare_step = (60 * bare["allreduce_decode_us"] + bare["gather_logits_us"]) if bare else 0.0
    rows.append((tp, pp, pre[0]["threads"], p_ts, p_ts / base["p"], d_ts, d_ts / base["d"], share, comm_step_us, bare_step))
print(f"total cores: {cores}; model: SmolLM2-135M-Instruct Q4_1; medians of runs (prefill: 512-token prompt; decode: 128 tokens)")
print("| tp | pp | ranks x threads | prefill t/s | vs (1,1) | decode t/s | vs (1,1) | comm share of decode run | comm per decode step (us) | bare MPI per step (us) | ratio |")
print("|----|----|-----------------|-------------|----------|------------|----------|--------------------------|---------------------------|------------------------|-------|")
for tp, pp, th, p, pr, d, dr, share, cs, bs in rows:
    ratio = f"{cs / bs:.2f}" if bs else ""
    tpc = f"{100*share:.1f}%" if tp > 1 else ""
    print(f"| {tp} | {pp} | {tp*pp} x {th} | {p:.1f} | {pr:.2f} | {d:.1f} | {dr:.2f} | {tpc} | {cs:.1f} | {bs:.1f} | {ratio} |")
for tp in (2, 3):
    b = json.load(open(f"{out}/bare.{tp}.json"))
    print(f"bare MPI, {tp} ranks: allreduce {b['n_embd']} floats {b['allreduce_decode_us']:.2f} us, "
          f"{b['n_embd']}x{b['prefill_tokens']} floats {b['allreduce_prefill_us']:.1f} us, logits gather {b['gather_logits_us']:.2f} us")
PY
