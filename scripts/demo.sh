#!/usr/bin/env bash
# The kvmesh main job, end to end on this machine: install and build, fetch the model, ask the
# real model a question, then hold a three-turn conversation over a ~1,300-token document,
# printing each answer with its time to first token and how many prompt tokens came from the
# KV cache of the earlier turns; then three independent requests over the same document,
# batched together, which compute the document once and share its KV blocks.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
model="$(scripts/model_pull.sh)"
question="${1:-What is the capital of France?}"
echo "== kvmesh run --chat --temperature 0 --prompt \"$question\"" >&2
build/bin/kvmesh run --model "$model" --chat --temperature 0 --max-tokens 128 --prompt "$question"

session="$(mktemp)"
trap 'rm -f "$session" "$session.requests"' EXIT
python3 - "$session" <<'PY'
import json, sys
doc = " ".join(f"Section {i}: the cluster stores block {i} of the shared context on tier {i % 3}."
               for i in range(1, 60))
json.dump([f"Here is a document:\n{doc}\n\nWhich tier stores block 7?", "And block 12?",
           "Which tier stores block 30?"], open(sys.argv[1], "w"))
json.dump([f"Here is a document:\n{doc}\n\nWhich tier stores block {b}?" for b in (4, 21, 45)],
          open(sys.argv[1] + ".requests", "w"))
PY
echo "== kvmesh run --session (3 turns over one document, prefix reuse on)" >&2
build/bin/kvmesh run --model "$model" --session "$session" --temperature 0 --max-tokens 48

echo "== kvmesh run --prompts (3 independent requests on the same document, batched)" >&2
show=$(cat <<'PY'
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f"[request {r['request']}] {r['prompt_tokens']} prompt tokens, "
          f"{r['cached_tokens']} cached, TTFT {r['ttft_ms']:.0f} ms")
    print(r["text"])
PY
)
build/bin/kvmesh run --model "$model" --chat --prompts "$session.requests" --temperature 0 \
  --max-tokens 32 | python3 -c "$show"
