#!/usr/bin/env bash
# The kvmesh test command (README, .ci/run): installs what a fresh Debian 12 machine lacks,
# builds, fetches the model, and runs every test: formatting, the GoogleTest suites (ctest),
# and the libFuzzer targets for a short fixed time.
#   FUZZ_SECONDS=N  seconds per fuzzer (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== model" >&2
scripts/model_pull.sh >/dev/null

echo "== format" >&2
sources="$(git ls-files '*.h' '*.cc' '*.cu')"  # a failing git fails the script here
mapfile -t sources <<<"$sources"
((${#sources[@]} > 100)) || { echo "format: only ${#sources[@]} sources listed" >&2; exit 1; }
clang-format --dry-run --Werror "${sources[@]}"

echo "== unit and integration tests" >&2
ctest --test-dir build --output-on-failure --no-tests=error -j "$(nproc)"

echo "== fuzzers" >&2
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
if [[ ! -f build-fuzz/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVMESH_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
fi
cmake --build build-fuzz --parallel "$(nproc)" >&2
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
for f in gguf tokenizer api_request rpc_frame; do
  mkdir -p "$corpus/$f"
  build-fuzz/bin/${f}_fuzzer -max_total_time="${FUZZ_SECONDS:-30}" -max_len=8192 \
    -print_final_stats=1 "$corpus/$f" "tests/fuzz/seeds/$f" 2>"$corpus/$f.log" ||
    { tail -n 40 "$corpus/$f.log" >&2; echo "fuzzer $f failed" >&2; exit 1; }
  grep -E "stat::number_of_executed_units" "$corpus/$f.log" | sed "s/^/$f: /" >&2
done
echo "== all tests passed" >&2
