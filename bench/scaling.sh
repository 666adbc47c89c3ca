#!/usr/bin/env bash
# Tensor-parallel scaling on this machine at a fixed total core count (2 by default):
# prefill and decode tokens/s for (tp, pp) in (1,1) (1 rank x 2 threads), (2,1) (2 ranks x 1
# thread), (3,1) (3 ranks x 1 thread, oversubscribed) and (1,2); the share of step time in
# collectives; and kvmesh's per-step communication against bare MPI_Allreduce latencies of the
# same sizes (bench/allreduce_bench).
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

run() {  # run TP THREADS TAG -- extra args
  local tp="$1" threads="$2" tag="$3"; shift 4
  for r in $(seq 1 "$reps"); do
    if [[ "$tp" == 1 ]]; then
      "$bin" run --model "$model" --threads "$threads" --temperature 0 --json "$@"
    else
      "${mpi[@]}" -np "$tp" "$bin" run --tp "$tp" --model "$model" --threads "$threads" --temperature 0 --json "$@"
    fi
  done >"$out/$tag.jsonl"
}
for cfg in "1 $cores" "2 $((cores / 2 > 0 ? cores / 2 : 1))" "3 1"; do
  read -r tp threads <<<"$cfg"
  echo "tp=$tp threads/rank=$threads" >&2
  run "$tp" "$threads" "prefill.$tp" -- --prompt "$prompt" --max-tokens 1
  run "$tp" "$threads" "decode.$tp" -- --prompt "Hello" --max-tokens 128 --ignore-eos
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
for tp in (1, 2, 3):
    pre, dec = load(f"prefill.{tp}"), load(f"decode.{tp}")
    p_ts = statistics.median(r["prefill_tokens_per_s"] for r in pre)
    d_ts = statistics.median(r["decode_tokens_per_s"] for r in dec)
    steps = [len(r["tokens"]) - 1 for r in dec]
    # Communication per decode step: the decode run's collectives less its one prefill step.
    comm_step_us = statistics.median(
        (r["comm_ms"] * 1e3) / max(1, len(r["tokens"])) for r in dec) if tp > 1 else 0.0
    share = statistics.median(r["comm_ms"] / (r["prefill_ms"] + r["decode_ms"]) for r in dec) if tp > 1 else 0.0
    calls = statistics.median(r["comm_calls"] / max(1, len(r["tokens"])) for r in dec) if tp > 1 else 0
    if tp == 1:
        base = {"p": p_ts, "d": d_ts}
    bare = json.load(open(f"{out}/bare.{tp}.json")) if tp > 1 else None
    bare_step = (60 * bare["allreduce_decode_us"] + bare["gather_logits_us"]) if bare else 0.0
    rows.append((tp, pre[0]["threads"], p_ts, p_ts / base["p"], d_ts, d_ts / base["d"], share, comm_step_us, bare_step))
print(f"total cores: {cores}; model: SmolLM2-135M-Instruct Q4_1; medians of runs (prefill: 512-token prompt; decode: 128 tokens)")
print("| tp | pp | ranks x threads | prefill t/s | vs (1,1) | decode t/s | vs (1,1) | comm share of decode run | comm per decode step (us) | bare MPI per step (us) | ratio |")
print("|----|----|-----------------|-------------|----------|------------|----------|--------------------------|---------------------------|------------------------|-------|")
for tp, th, p, pr, d, dr, share, cs, bs in rows:
    ratio = f"{cs / bs:.2f}" if bs else ""
    print(f"| {tp} | 1 | {tp} x {th} | {p:.1f} | {pr:.2f} | {d:.1f} | {dr:.2f} | {100*share:.1f}% | {cs:.1f} | {bs:.1f} | {ratio} |")
print("| 1 | 2 | - | pipeline parallelism not implemented yet | | | | | | | |")
for tp in (2, 3):
    b = json.load(open(f"{out}/bare.{tp}.json"))
    print(f"bare MPI, {tp} ranks: allreduce {b['n_embd']} floats {b['allreduce_decode_us']:.2f} us, "
          f"{b['n_embd']}x{b['prefill_tokens']} floats {b['allreduce_prefill_us']:.1f} us, logits gather {b['gather_logits_us']:.2f} us")
PY
