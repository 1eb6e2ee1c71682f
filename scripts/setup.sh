#!/usr/bin/env bash
# Installs every Debian package that troupe's build, tests and benchmarks need.
# Idempotent: when everything is present it only checks (a second or two).
# Run as root on Debian 12 (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev libopenblas0-openmp libopenblas-dev
  libcaf-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  libsqlite3-dev python3-grpcio python3-grpc-tools python3-jinja2 libonig-dev
  chromium chromium-driver python3-selenium
  iproute2 openssl
  slurm-wlm munge
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "setup: missing packages (${missing[*]}) and not root; rerun as root" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Debian's LibTorch calls whatever BLAS the alternatives system points at.
# The reference BLAS is ~35x slower than OpenBLAS here, and OpenBLAS's pthread
# build runs its own thread pool beside LibTorch's OpenMP pool: on a small
# machine the two spin against each other (3x slower batched decode, 5x slower
# dense forward, see docs/benchmarks.md). The OpenMP build shares one pool.
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu \
           libopenblas.so.0-x86_64-linux-gnu; do
  target=$(update-alternatives --list "$alt" 2>/dev/null | grep -m1 openblas-openmp || true)
  current=$(readlink -f "/etc/alternatives/$alt" 2>/dev/null || true)
  if [ -n "$target" ] && [ "$current" != "$(readlink -f "$target")" ]; then
    if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
      echo "setup: $alt points at $current, not $target; rerun as root to switch" >&2
      exit 1
    fi
    $SUDO update-alternatives --set "$alt" "$target" >/dev/null
    echo "setup: $alt -> $target"
  fi
done
# npm packages at the versions a package-lock.json pins, installed with `npm ci`
# when missing or older than the lock file. npm comes with Node.js; Debian's
# npm package where there is none.
npm_ci() {
  local dir=$1 marker=$2
  if [ -f "$dir/node_modules/$marker" ] && [ ! "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    return
  fi
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
      echo "setup: npm is missing and not root; rerun as root" >&2
      exit 1
    fi
    $SUDO apt-get install -y -qq --no-install-recommends npm
  fi
  echo "setup: npm ci in ${dir#"$root"/}"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The dashboard's charting library; the build embeds it (cluster/CMakeLists.txt).
npm_ci "$root/web" uplot/dist/uPlot.iife.min.js
# Real tokenizer files and Hugging Face's Node binding of tokenizers, the
# reference the tokenizer tests compare with (tests/reference/package.json).
npm_ci "$root/tests/reference" tokenizers/package.json
echo "setup: done"
