#!/usr/bin/env bash
# kvmesh vs llama.cpp on the same GGUF, threads and machine, in one run.
#
#   bench/compare_llamacpp.sh LLAMA_BENCH [--model PATH] [--threads 1,2] [--reps 5]
#   bench/compare_llamacpp.sh --build-from LLAMA_CPP_SRC [...]   (builds llama-bench first)
#
# For each thread count and test (pp512, tg128, tg128 at depth 4096) the two engines run
# alternately (llama.cpp, kvmesh, llama.cpp, kvmesh: two rounds, medians pooled), then a table
# of medians, ratios and the memory-bandwidth bound of decode is printed. No llama.cpp code is
# part of kvmesh: bring your own binary or source tree.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
kvmesh="${KVMESH_BIN:-$root/build/bin/kvmesh}"
model="${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf"
threads="1,2"
reps=5
llama_bench=""

while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --build-from)
      src="$2"; shift 2
      cmake -S "$src" -B "$src/build-bench" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >&2
      cmake --build "$src/build-bench" --target llama-bench -j "$(nproc)" >&2
      llama_bench="$src/build-bench/bin/llama-bench" ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) llama_bench="$1"; shift ;;
  esac
done
[[ -x "$llama_bench" ]] || { echo "compare_llamacpp: need the path of a llama-bench binary (or --build-from SRC)" >&2; exit 2; }
[[ -x "$kvmesh" ]] || { echo "compare_llamacpp: $kvmesh not built (run scripts/setup.sh)" >&2; exit 2; }
[[ -f "$model" ]] || { echo "compare_llamacpp: model $model not found (kvmesh model pull)" >&2; exit 2; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
IFS=',' read -ra tlist <<<"$threads"
tests=("512 0 0" "0 128 0" "0 128 4096")
for round in 1 2; do
  for t in "${tlist[@]}"; do
    for spec in "${tests[@]}"; do
      read -r p n d <<<"$spec"
      echo "round $round: t=$t p=$p n=$n d=$d" >&2
      "$llama_bench" -m "$model" -p "$p" -n "$n" -d "$d" -t "$t" -r "$reps" -o json \
        >"$out/llama.$round.$t.$p.$n.$d.json" 2>/dev/null
      "$kvmesh" bench --model "$model" -p "$p" -n "$n" -d "$d" -t "$t" -r "$reps" --json \
        >"$out/kvmesh.$round.$t.$p.$n.$d.json"
    done
  done
done

python3 - "$out" "$threads" "$model" "$llama_bench" <<'PY'
import glob, json, os, platform, statistics, subprocess, sys
out, threads, model, lb = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
def samples(engine, t, p, n, d):
    s = []
    for f in sorted(glob.glob(f"{out}/{engine}.*.{t}.{p}.{n}.{d}.json")):
        txt = open(f).read().strip()
        if not txt:
            continue
        if engine == "llama":
            for r in json.loads(txt):
                s += r["samples_ts"]
        else:
            for line in txt.splitlines():
                r = json.loads(line)
                s += r["samples_ts"]
                extra = r
    return s, (extra if engine == "kvmesh" else None)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
bw = sorted([(r.get("threads"), r.get("bandwidth_gbps")) for r in [json.loads(l) for f in glob.glob(f"{out}/kvmesh.*.json") for l in open(f) if l.strip()] if r.get("bandwidth_gbps")])
print(f"CPU: {cpu}; model: {os.path.basename(model)}; llama-bench: {lb}")
print("read bandwidth measured by kvmesh bench: " + ", ".join(f"{t} threads {g:.1f} GB/s" for t, g in sorted(set(bw))))
print(f"| test           | threads | llama.cpp t/s (median) | kvmesh t/s (median) | ratio | goal      | decode bound t/s | kvmesh % of bound | kvmesh RSS / budget MiB |")
print(f"|----------------|---------|------------------------|---------------------|-------|-----------|------------------|-------------------|-------------------------|")
for t in threads:
    for p, n, d in ((512, 0, 0), (0, 128, 0), (0, 128, 4096)):
        ls, _ = samples("llama", t, p, n, d)
        ks, kx = samples("kvmesh", t, p, n, d)
        name = f"pp{p}" if p else f"tg{n}" + (f" @ d{d}" if d else "")
        if not ls or not ks:
            print(f"| {name:14} | {t:>7} | missing | missing | | | | |")
            continue
        lm, km = statistics.median(ls), statistics.median(ks)
        goal = 1.5 if p else 1.0
        # The bound from the median of every bandwidth probe at this thread count.
        bws = sorted(g for tt, g in bw if str(tt) == str(t))
        bound = (statistics.median(bws) * 1e9 / kx["bytes_per_token"]) if (n and bws) else 0
        bound_s = f"{bound:.0f}" if bound else ""
        pct = f"{100 * km / bound:.0f}%" if bound else ""
        ok = "ok" if km / lm >= goal else "MISS"
        rss = f"{kx['rss_mib']:.0f} / {kx['rss_budget_mib']:.0f}"
        print(f"| {name:14} | {t:>7} | {lm:22.1f} | {km:19.1f} | {km/lm:5.2f} | {goal:.1f}x {ok:4} | {bound_s:>16} | {pct:>17} | {rss:>23} |")
PY
