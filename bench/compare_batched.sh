#!/usr/bin/env bash
# Batched decode over one shared context, kvmesh vs llama.cpp, in one run on one machine.
#
#   bench/compare_batched.sh LLAMA_BATCHED_BENCH [--contexts 1024,4096] [--rounds 2]
#       [--threads 2] [--decode-tokens 64] [--activation-bits 16]
#
# For each round and context the two engines run alternately: llama.cpp's llama-batched-bench
# (-npp CTX -ntg N -npl 1,16 -pps: the prompt computed once and shared by every sequence) and
# kvmesh's shared_context_bench --decode-only (1 and 16 sequences over a CTX-token context in
# the prefix cache, each with its own question). Both count decode tokens over the time from
# every sequence having its first token to the last one finishing. Printed: medians over the
# rounds, each engine's 16 / 1 ratio, and kvmesh / llama.cpp at each concurrency. No llama.cpp
# code is part of kvmesh: bring your own binary (a llama.cpp tree builds it with
# `cmake --build BUILD --target llama-batched-bench`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
kbench="${KVMESH_BENCH_BIN:-$root/build/bin/shared_context_bench}"
model="${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf"
contexts="1024,4096"
rounds=2
threads=2
ntg=64
bits=16
lbb=""
while (($#)); do
  case "$1" in
    --contexts) contexts="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --decode-tokens) ntg="$2"; shift 2 ;;
    --activation-bits) bits="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "compare_batched: unknown flag $1" >&2; exit 2 ;;
    *) lbb="$1"; shift ;;
  esac
done
[[ -x "$lbb" ]] || { echo "compare_batched: need the path of a llama-batched-bench binary" >&2; exit 2; }
[[ -x "$kbench" ]] || { echo "compare_batched: $kbench not built (run scripts/setup.sh)" >&2; exit 2; }
[[ -f "$model" ]] || { echo "compare_batched: model $model not found (kvmesh model pull)" >&2; exit 2; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
IFS=',' read -ra clist <<<"$contexts"
for round in $(seq 1 "$rounds"); do
  for c in "${clist[@]}"; do
    echo "round $round: context $c" >&2
    "$lbb" -m "$model" -c $((16 * (c + ntg) + 512)) -b 2048 -ub 512 -npp "$c" -ntg "$ntg" \
      -npl 1,16 -pps -t "$threads" >"$out/llama.$round.$c.txt" 2>/dev/null
    "$kbench" --model "$model" --decode-only --contexts "$c" --concurrency 1,16 --reps 1 \
      --decode-tokens "$ntg" --threads "$threads" --activation-bits "$bits" --json \
      >"$out/kvmesh.$round.$c.json"
  done
done

python3 - "$out" "$contexts" "$lbb" "$threads" "$bits" <<'PY'
import glob, json, statistics, sys
out, contexts, lbb, threads, bits = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4], sys.argv[5]
def llama(c):  # {sequences: [S_TG t/s per round]} from llama-batched-bench's table
    r = {}
    for f in glob.glob(f"{out}/llama.*.{c}.txt"):
        for line in open(f):
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(cells) >= 8 and cells[0].isdigit():
                r.setdefault(int(cells[2]), []).append(float(cells[7]))
    return r
def kvmesh(c):
    r = {}
    for f in glob.glob(f"{out}/kvmesh.*.{c}.json"):
        for d in json.load(open(f))["decode"]:
            r.setdefault(d["sequences"], []).append(d["tokens_per_s"])
    return r
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}; {threads} threads; kvmesh {bits}-bit activations; llama-batched-bench: {lbb}")
print("| context | sequences | llama.cpp t/s (median) | kvmesh t/s (median) | kvmesh / llama.cpp | rounds |")
print("|---|---|---|---|---|---|")
ratios = []
for c in contexts:
    l, k = llama(c), kvmesh(c)
    for n in (1, 16):
        if not l.get(n) or not k.get(n):
            print(f"| {c} | {n} | missing | missing | | |")
            continue
        lm, km = statistics.median(l[n]), statistics.median(k[n])
        print(f"| {c} | {n} | {lm:.1f} | {km:.1f} | {km / lm:.2f}x | {min(len(l[n]), len(k[n]))} |")
    if l.get(1) and l.get(16) and k.get(1) and k.get(16):
        ratios.append((c, statistics.median(l[16]) / statistics.median(l[1]),
                       statistics.median(k[16]) / statistics.median(k[1])))
for c, lr, kr in ratios:
    print(f"context {c}: 16 sequences / 1 sequence: llama.cpp {lr:.2f}x, kvmesh {kr:.2f}x")
PY
