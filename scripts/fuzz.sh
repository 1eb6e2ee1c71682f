#!/usr/bin/env bash
# Builds the libFuzzer form of troupe's fuzz targets (NOTE [fuzz targets]
# in tests/fuzz/replay_main.cpp) with clang 14, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each from its seed corpus.
#
#   scripts/fuzz.sh [--seconds N | --minutes N] [TARGET ...]
#
# Default: every target below for 10 seconds. A crash, a sanitizer report,
# a leak or a timeout (an input over 10 s) fails the run; its reproducer is
# left in tests/fuzz/findings/<target>/ (copy it into
# tests/fuzz/reproducers/<target>/ with the fix, so the normal build's
# replay test keeps it fixed). The corpus each run grows stays in
# build-fuzz/corpus/<target>/; the repository's seeds are not touched.
# Each target lists the sources it compiles (it builds those objects
# only, not troupe); the normal build compiles the same files as replay
# executables (tests/fuzz/CMakeLists.txt).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${TROUPE_FUZZ_DIR:-$root/build-fuzz}
seconds=10

declare -A sources=(
  [heartbeat]="cluster/heartbeats.cpp runtime/inflight.cpp runtime/hash.cpp runtime/error.cpp"
  [journal]="actors/job/events.cpp runtime/error.cpp"
)
declare -A libs=(
  [heartbeat]="-lcaf_core"
  [journal]="-lcaf_core"
)

targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --minutes) seconds=$(($2 * 60)); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -n ${sources[$1]+x} ]] || { echo "fuzz.sh: no target '$1' (have: ${!sources[*]})" >&2; exit 2; }
       targets+=("$1"); shift ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(printf '%s\n' "${!sources[@]}" | sort)
# (77: ctest's skip code, for the short run the test suite makes.)
command -v clang++-14 >/dev/null || { echo "fuzz.sh: clang++-14 is missing (scripts/setup.sh installs it)" >&2; exit 77; }

cxx=(clang++-14 -std=c++20 -O1 -g -fno-omit-frame-pointer
     -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root")
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$out/bin" "$out/corpus/$t" "$root/tests/fuzz/findings/$t"
  srcs=("$root/tests/fuzz/${t}_fuzz.cpp")
  for s in ${sources[$t]}; do srcs+=("$root/$s"); done
  echo "fuzz.sh: building $t"
  # shellcheck disable=SC2086
  "${cxx[@]}" "${srcs[@]}" ${libs[$t]} -pthread -o "$out/bin/$t"
  dict=()
  [[ -f $root/tests/fuzz/dict/$t.dict ]] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  echo "fuzz.sh: running $t for ${seconds} s"
  if ! ASAN_OPTIONS=detect_leaks=1 "$out/bin/$t" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$root/tests/fuzz/findings/$t/" \
      "${dict[@]}" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" 2>"$out/$t.log"; then
    echo "fuzz.sh: $t FAILED; its output: $out/$t.log; reproducers in tests/fuzz/findings/$t/" >&2
    grep -E "ERROR|SUMMARY|runtime error" "$out/$t.log" | head -5 >&2 || true
    failed=1
    continue
  fi
  grep -E "^stat::(number_of_executed_units|peak_rss_mb|new_units_added)|cov:" "$out/$t.log" | tail -4
  rmdir "$root/tests/fuzz/findings/$t" 2>/dev/null || true
done
rmdir "$root/tests/fuzz/findings" 2>/dev/null || true
exit $failed
