#!/usr/bin/env bash
# The kvmesh main job, end to end on this machine: install and build, fetch the model, and ask
# the real model a question through the single-process engine (`kvmesh run --chat`).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
model="$(scripts/model_pull.sh)"
question="${1:-What is the capital of France?}"
echo "== kvmesh run --chat --temperature 0 --prompt \"$question\"" >&2
build/bin/kvmesh run --model "$model" --chat --temperature 0 --max-tokens 128 --prompt "$question"
