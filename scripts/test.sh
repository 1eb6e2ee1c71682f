#!/usr/bin/env bash
# Builds troupe and its tests (not the benchmarks: scripts/build.sh builds
# everything) and runs the whole test suite (unit, integration, slow; GPU
# tests skip at run time without a device). Extra arguments go to ctest,
# e.g. scripts/test.sh -L unit
# Prints the seconds spent in setup, build and tests at the end (CI's time,
# visible: each issue's note states what it added).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TROUPE_BUILD_DIR:-$root/build}

declare -A spent=()
phase_start=$SECONDS
phase=setup
report() {
  spent[$phase]=$((SECONDS - phase_start))
  echo "test.sh: seconds: setup ${spent[setup]:-0}, build ${spent[build]:-0}, tests ${spent[tests]:-0}" \
       "(total $SECONDS)"
}
trap report EXIT
next_phase() {
  spent[$phase]=$((SECONDS - phase_start))
  phase=$1
  phase_start=$SECONDS
}

bash "$root/scripts/setup.sh" >&2
next_phase build
bash "$root/scripts/build.sh" troupe_check
next_phase tests
cd "$build"
# --timeout wins over the suites' TIMEOUT property here; the longest test
# (the tool-use learning curve: SFT, then GRPO) takes about 5 min alone and
# longer beside another test.
ctest --output-on-failure --timeout 900 -j "${TROUPE_TEST_JOBS:-2}" "$@"
