#!/usr/bin/env bash
# Builds troupe and its tests (not the benchmarks: scripts/build.sh builds
# everything) and runs the whole test suite (unit, integration, slow; GPU
# tests skip at run time without a device). Extra arguments go to ctest,
# e.g. scripts/test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TROUPE_BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh" troupe_check
cd "$build"
ctest --output-on-failure --timeout 400 -j "${TROUPE_TEST_JOBS:-2}" "$@"
