#!/usr/bin/env bash
# Tensor and pipeline parallelism across MPI ranks on the real model: greedy tokens identical to
# the single-process engine and last-position logits within 1e-3 relative L2, for tp = 1..4 with
# pp = 1, pp = 2 with tp = 1 and tp x pp = 2 x 2; the launch errors (world size, tp > heads, a
# rank that cannot read the model, ranks given different flags or model files) reported on every
# rank with a non-zero exit; and a rank killed mid-generation ends the job promptly.
# Usage: tp_test.sh KVMESH_BINARY
set -uo pipefail
bin="$1"
model="${KVMESH_MODEL:-${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$model" ]]; then echo "SKIP: model not pulled ($model)"; exit 77; fi
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
mpi=(mpirun --oversubscribe --bind-to none)
[[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The third prompt (~160 tokens) makes pipeline stages split the prefill into micro-batches.
long="$(printf 'Block %s of the shared context is stored on the host tier. ' $(seq 1 12))"
prompts=("The capital of France is"
         "$long Which tier holds block 7?"
         "<|im_start|>user
Write a haiku about caches.<|im_end|>
<|im_start|>assistant
")
common=(--model "$model" --temperature 0 --max-tokens 24 --ignore-eos --json --threads 1)

for i in "${!prompts[@]}"; do
  p="${prompts[$i]}"
  "$bin" run "${common[@]}" --prompt "$p" >"$work/ref.$i.json" || fail "single-process run"
  "$bin" logits --model "$model" --threads 1 --top-k 49152 --prompt "$p" >"$work/ref.$i.logits" || fail "single-process logits"
  # TP groups sum through shared memory by default; "mpi" runs the same through MPI collectives.
  for cfg in "1 1 shm" "2 1 shm" "2 1 mpi" "3 1 shm" "4 1 shm" "1 2 shm" "2 2 shm"; do
    read -r tp pp coll <<<"$cfg"
    np=$((tp * pp))
    tag="tp$tp.pp$pp.$coll"
    "${mpi[@]}" -np "$np" "$bin" run --tp "$tp" --pp "$pp" --tp-collectives "$coll" "${common[@]}" --prompt "$p" >"$work/$tag.$i.json" 2>"$work/err" ||
      fail "$tag run: $(tail -n 5 "$work/err")"
    "${mpi[@]}" -np "$np" "$bin" logits --tp "$tp" --pp "$pp" --tp-collectives "$coll" --model "$model" --threads 1 --top-k 49152 --prompt "$p" \
      >"$work/$tag.$i.logits" 2>"$work/err" || fail "$tag logits: $(tail -n 5 "$work/err")"
    python3 - "$work/ref.$i.json" "$work/$tag.$i.json" "$work/ref.$i.logits" "$work/$tag.$i.logits" "$tag" <<'PY' || exit 1
import json, math, sys
ref, got = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
if ref["tokens"] != got["tokens"]:
    sys.exit(f"FAIL: {sys.argv[5]} tokens {got['tokens']} != single-process {ref['tokens']}")
a = dict((i, v) for i, v in json.load(open(sys.argv[3])))
b = dict((i, v) for i, v in json.load(open(sys.argv[4])))
assert len(a) == len(b) == 49152, (len(a), len(b))
num = sum((b[i] - a[i]) ** 2 for i in a)
den = sum(v * v for v in a.values())
rel = math.sqrt(num / den)
print(f"{sys.argv[5]}: {len(got['tokens'])} tokens identical, logits rel L2 {rel:.2e}")
if rel >= 1e-3:
    sys.exit(f"FAIL: {sys.argv[5]} logits rel L2 {rel}")
PY
  done
done

# A multi-turn session with prefix reuse: the same answers under every layout.
python3 - "$work/session.json" <<'PY'
import json, sys
doc = " ".join(f"Item {i} is kept on shelf {i % 4}." for i in range(1, 30))
json.dump([doc + " Where is item 9?", "And item 14?"], open(sys.argv[1], "w"))
PY
"$bin" run --model "$model" --threads 1 --temperature 0 --max-tokens 16 --json --session "$work/session.json" >"$work/session.ref" || fail "session run"
for cfg in "2 1" "1 2"; do
  read -r tp pp <<<"$cfg"
  "${mpi[@]}" -np $((tp * pp)) "$bin" run --tp "$tp" --pp "$pp" --model "$model" --threads 1 --temperature 0 \
    --max-tokens 16 --json --session "$work/session.json" >"$work/session.$tp.$pp" 2>"$work/err" || fail "session tp=$tp pp=$pp: $(tail -n 3 "$work/err")"
  python3 - "$work/session.ref" "$work/session.$tp.$pp" <<'PY' || fail "session tp=$tp pp=$pp differs"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [t["tokens"] for t in a] == [t["tokens"] for t in b], "tokens differ"
assert [t["cached_tokens"] for t in a] == [t["cached_tokens"] for t in b], "cached counts differ"
assert b[1]["cached_tokens"] > 0, "turn 2 reused nothing"
PY
  echo "session tp=$tp pp=$pp: same answers, turn 2 reused $(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[1])['cached_tokens'])" "$work/session.$tp.$pp") tokens"
done

# The serving engine under tp = 2 and pp = 2: a batch of requests with continuous batching,
# chunked prefill, prefix reuse and forced preemption (p = 0.5 per step) gives every request
# exactly the tokens it gets alone (one at a time, no reuse) and in the single process.
python3 - "$work/batch.json" <<'PY'
import json, sys
doc = " ".join(f"Item {i} is kept on shelf {i % 4}." for i in range(1, 30))
json.dump([doc + " Where is item 9?", "Name a fruit.", doc + " Where is item 21?",
           "Count from one to five.", "Say hello in French."], open(sys.argv[1], "w"))
PY
batch=(--model "$model" --threads 1 --temperature 0 --max-tokens 12 --chat --prompts "$work/batch.json")
"$bin" run "${batch[@]}" --max-seqs 1 --no-prefix-reuse >"$work/batch.ref" 2>/dev/null || fail "batch alone"
# pp > 1 keeps pp steps in flight (the stages overlap); 2 x 2 pipelines TP groups.
for cfg in "2 1" "1 2" "2 2"; do
  read -r tp pp <<<"$cfg"
  "${mpi[@]}" -np $((tp * pp)) "$bin" run --tp "$tp" --pp "$pp" "${batch[@]}" --max-seqs 1 --no-prefix-reuse \
    >"$work/batch.alone.$tp.$pp" 2>"$work/err" || fail "batch alone tp=$tp pp=$pp: $(tail -n 3 "$work/err")"
  "${mpi[@]}" -np $((tp * pp)) "$bin" run --tp "$tp" --pp "$pp" "${batch[@]}" --max-seqs 8 \
    --max-batched-tokens 64 --kv-cache-mem 8 --test-preempt 0.5 \
    >"$work/batch.$tp.$pp" 2>"$work/err" || fail "batch tp=$tp pp=$pp: $(tail -n 3 "$work/err")"
  python3 - "$work/batch.ref" "$work/batch.alone.$tp.$pp" "$work/batch.$tp.$pp" <<'PY' || fail "batch tp=$tp pp=$pp differs"
import json, sys
ref, alone, got = ([json.loads(l) for l in open(f)] for f in sys.argv[1:4])
assert [r["tokens"] for r in alone] == [r["tokens"] for r in ref], "alone differs from single process"
assert [r["tokens"] for r in got] == [r["tokens"] for r in ref], "batched differs from alone"
assert sum(r["preemptions"] for r in got) > 0, "nothing was preempted"
PY
  echo "batch tp=$tp pp=$pp: 5 requests batched with preemption = alone = single process ($(grep -o 'requests in.*' "$work/err"))"
done

# The same with 8-bit activations (--activation-bits 8) and with bf16 attention
# (--attention-bits 16) under tp = 2: batched with preemption = each request alone under tp = 2.
# (Not = the single process: the row-parallel products sum their halves in another order, and
# 8-bit rounding turns such last-bit differences into different greedy tokens: on an AVX-512
# machine "Say hello in French." parts at its 8th token.)
for numerics in "--activation-bits 8" "--attention-bits 16"; do
  read -r flag value <<<"$numerics"
  "${mpi[@]}" -np 2 "$bin" run --tp 2 "${batch[@]}" --max-seqs 1 --no-prefix-reuse "$flag" "$value" \
    >"$work/batch.ref.n" 2>/dev/null || fail "batch alone tp=2, $numerics"
  "${mpi[@]}" -np 2 "$bin" run --tp 2 "${batch[@]}" --max-seqs 8 --max-batched-tokens 64 --kv-cache-mem 8 \
    --test-preempt 0.5 "$flag" "$value" >"$work/batch.n" 2>"$work/err" ||
    fail "batch tp=2, $numerics: $(tail -n 3 "$work/err")"
  python3 - "$work/batch.ref.n" "$work/batch.n" <<'PY' || fail "batch tp=2 with $numerics differs"
import json, sys
ref, got = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert [r["tokens"] for r in got] == [r["tokens"] for r in ref], "batched tp=2 differs from alone"
assert sum(r["preemptions"] for r in got) > 0, "nothing was preempted"
PY
  echo "batch tp=2, $numerics: batched with preemption = each request alone"
done

# Data parallelism: dp = 2 (and dp = 2 x tp = 2, dp = 2 x pp = 2) replicas, the coordinator routing requests
# between them: the same tokens as the single process, both replicas used, and a session kept on
# its replica (cached tokens climb).
for cfg in "2 1 1" "2 2 1" "2 1 2"; do
  read -r dp tp pp <<<"$cfg"
  "${mpi[@]}" -np $((dp * tp * pp)) "$bin" run --dp "$dp" --tp "$tp" --pp "$pp" "${batch[@]}" --max-seqs 8 \
    >"$work/batch.dp$dp.tp$tp" 2>"$work/err" || fail "batch dp=$dp tp=$tp pp=$pp: $(tail -n 3 "$work/err")"
  python3 - "$work/batch.ref" "$work/batch.dp$dp.tp$tp" <<'PY' || fail "batch dp=$dp tp=$tp pp=$pp differs"
import json, sys
ref, got = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert [r["tokens"] for r in got] == [r["tokens"] for r in ref], "tokens differ from the single process"
PY
  per="$(grep -o 'requests per data-parallel replica:.*' "$work/err")"
  python3 -c "import sys; c=[int(x) for x in sys.argv[1].split(':')[1].split()]; assert len(c)==2 and min(c)>0, c" "$per" ||
    fail "dp=$dp tp=$tp pp=$pp did not use both replicas: $per"
  echo "batch dp=$dp tp=$tp pp=$pp: same tokens as the single process; $per"
done
# Three questions over one document submitted together under dp = 2: routed to one replica
# (the document is queued there in the first one's prompt before any of it is cached), so the
# other two read it from the cache (serving/router.h); tokens as the single process's.
python3 - "$work/doc.json" <<'PY'
import json, sys
doc = " ".join(f"Item {i} is kept on shelf {i % 4}." for i in range(1, 30))
json.dump([doc + f" Where is item {i}?" for i in (9, 21, 4)], open(sys.argv[1], "w"))
PY
doc_batch=(--model "$model" --threads 1 --temperature 0 --max-tokens 8 --chat --prompts "$work/doc.json" --json)
"$bin" run "${doc_batch[@]}" >"$work/doc.ref" 2>/dev/null || fail "document batch, single process"
"${mpi[@]}" -np 2 "$bin" run --dp 2 "${doc_batch[@]}" >"$work/doc.dp2" 2>"$work/err" ||
  fail "document batch dp=2: $(tail -n 3 "$work/err")"
per="$(grep -o 'requests per data-parallel replica:.*' "$work/err")"
python3 - "$work/doc.ref" "$work/doc.dp2" "$per" <<'PY' || fail "document batch dp=2: $per"
import json, sys
ref, got = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert [r["tokens"] for r in got] == [r["tokens"] for r in ref], "tokens differ from the single process"
per = sorted(int(x) for x in sys.argv[3].split(":")[1].split())
assert per == [0, 3], f"the three went to different replicas: {per}"
cached = [r["cached_tokens"] for r in got]
assert cached[0] == 0 and min(cached[1:]) >= 300, f"cached tokens {cached}"
PY
echo "document batch dp=2: three questions on one replica, cached tokens $(python3 -c "import json,sys; print([json.loads(l)['cached_tokens'] for l in open(sys.argv[1])])" "$work/doc.dp2")"
"${mpi[@]}" -np 2 "$bin" run --dp 2 --model "$model" --threads 1 --temperature 0 --max-tokens 16 --json \
  --session "$work/session.json" >"$work/session.dp2" 2>"$work/err" || fail "session dp=2: $(tail -n 3 "$work/err")"
python3 - "$work/session.ref" "$work/session.dp2" <<'PY' || fail "session dp=2 differs"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [t["tokens"] for t in a] == [t["tokens"] for t in b], "tokens differ"
assert [t["cached_tokens"] for t in a] == [t["cached_tokens"] for t in b], "cached counts differ"
PY
echo "session dp=2: same answers and cached tokens (the session stays on its replica)"

# --print-plan shows a balanced split for tp = 2 (9 query heads: 5 + 4).
"${mpi[@]}" -np 2 "$bin" run --tp 2 --model "$model" --prompt hi --max-tokens 1 --print-plan >/dev/null 2>"$work/plan" || fail "print-plan"
grep -q "rank 0: replica 0 stage 0 layers \[0,30), tp rank 0/2: query heads \[0,5), kv heads \[0,2)" "$work/plan" || fail "plan: $(cat "$work/plan")"
grep -q "rank 1: replica 0 stage 0 layers \[0,30), tp rank 1/2: query heads \[5,9), kv heads \[1,3)" "$work/plan" || fail "plan: $(cat "$work/plan")"

# Launch errors: the same one-line error on every rank, non-zero exit, no hang.
expect_all() {  # expect_all NEEDLE N_RANKS -- command...
  local needle="$1" n="$2"; shift 3
  timeout 60 "$@" >"$work/out" 2>"$work/err" && fail "'$needle' case exited 0"
  local got
  got="$(grep -o -- "$needle" "$work/err" | wc -l)"  # ranks' lines may interleave
  [[ "$got" -ge "$n" ]] || fail "'$needle' printed by $got of $n ranks: $(head -n 5 "$work/err")"
}
expect_all "world size 3 does not match dp x pp x tp = 1 x 1 x 2" 3 -- \
  "${mpi[@]}" -np 3 "$bin" run --tp 2 --model "$model" --prompt x
expect_all "is larger than the model's 9 query heads" 10 -- \
  "${mpi[@]}" -np 10 "$bin" run --tp 10 --model "$model" --prompt x --threads 1
expect_all "rank 1: cannot open model file '/nonexistent/model.gguf'" 2 -- \
  "${mpi[@]}" -np 1 "$bin" run --tp 2 --model "$model" --prompt x : -np 1 "$bin" run --tp 2 --model /nonexistent/model.gguf --prompt x
expect_all "world size 3 does not match dp x pp x tp = 1 x 2 x 2" 3 -- \
  "${mpi[@]}" -np 3 "$bin" run --tp 2 --pp 2 --model "$model" --prompt x
# Ranks given different settings refuse to start together (they once hung in the first step's
# all-reduce, or under dp served one replica's zero logits): a flag, then another model file.
expect_all "rank 1: --kv-cache-mem 1, but rank 0 has --kv-cache-mem 64 (every rank needs the same)" 2 -- \
  "${mpi[@]}" -np 1 "$bin" run --tp 2 --kv-cache-mem 64 --model "$model" --prompt x --threads 1 : \
  -np 1 "$bin" run --tp 2 --kv-cache-mem 1 --model "$model" --prompt x --threads 1
expect_all "rank 1: --tp 1, but rank 0 has --tp 2 (every rank needs the same)" 2 -- \
  "${mpi[@]}" -np 1 "$bin" run --tp 2 --model "$model" --prompt x --threads 1 : \
  -np 1 "$bin" run --tp 1 --model "$model" --prompt x --threads 1
cp "$model" "$work/other.gguf" && head -c 64 /dev/zero >>"$work/other.gguf"
expect_all "rank 1: model and KV layout model=" 2 -- \
  "${mpi[@]}" -np 1 "$bin" run --dp 2 --model "$model" --prompt x --threads 1 : \
  -np 1 "$bin" run --dp 2 --model "$work/other.gguf" --prompt x --threads 1

# A rank killed mid-generation: the job ends within 30 s, naming the lost rank.
"${mpi[@]}" -np 2 "$bin" run --tp 2 --model "$model" --threads 1 --temperature 0.9 --seed 1 \
  --max-tokens 8000 --ignore-eos --prompt "Tell me a very long story." >"$work/out" 2>"$work/err" &
job=$!
victim=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -f "kvmesh run --tp 2"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
  done
  [[ -n "$victim" ]] && break
  sleep 0.1
done
[[ -n "$victim" ]] || fail "could not find rank 1"
sleep 2
kill -9 "$victim"
start=$SECONDS
for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then kill -9 "$job"; fail "job still running 30 s after rank 1 was killed"; fi
wait "$job" && fail "job exited 0 after losing rank 1"
grep -qi "rank 1" "$work/err" || fail "the lost rank is not named: $(tail -n 5 "$work/err")"
echo "rank death: job ended $((SECONDS - start)) s after rank 1 was killed"
echo "tp: all cases passed"
