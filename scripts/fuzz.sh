#!/usr/bin/env bash
# Builds the libFuzzer form of troupe's fuzz targets (NOTE [fuzz targets]
# in tests/fuzz/replay_main.cpp) with clang 14, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each from its seed corpus.
#
#   scripts/fuzz.sh [--seconds N | --minutes N] [--jobs N] [TARGET ...]
#
# Default: every target below for 10 seconds each. A crash, a sanitizer
# report, a leak in troupe's frames (tests/fuzz/lsan.supp lists the
# libraries' static state) or a slow input (over 10 s) fails the run; its
# reproducer is left in tests/fuzz/findings/<target>/ ($TROUPE_FUZZ_FINDINGS
# when set; the test suite's run puts them in its build folder) (copy it into
# tests/fuzz/reproducers/<target>/ with the fix, so the normal build's
# replay test keeps it fixed). The corpus each run grows stays in
# build-fuzz/corpus/<target>/; the repository's seeds are not touched.
#
# Each target lists the sources it compiles: just its objects, not troupe
# (they are compiled once for all targets, incrementally, by a Ninja file
# written here). The targets that need LibTorch, gRPC or CAF's network
# (tensor batches, role messages, the JobService and NodeService handlers,
# the dashboard) exist as replay executables of the normal build only:
# Debian's LibTorch 1.13 headers do not compile with clang 14 in C++20
# (NOTE [fuzz targets]).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${TROUPE_FUZZ_DIR:-$root/build-fuzz}
findings=${TROUPE_FUZZ_FINDINGS:-$root/tests/fuzz/findings}
seconds=10
jobs=2

# The source groups the targets share.
base="runtime/error.cpp"
json="runtime/jsonl.cpp runtime/file_io.cpp runtime/utf8.cpp"
unicode="models/tokenizer_unicode.cpp models/tokenizer_unicode_tables.cpp"
chat="$(cd "$root" && echo models/chat_template*.cpp) $unicode"
decode="kernels/cpu/decode_isa.cpp kernels/cpu/decode_panels.cpp kernels/cpu/decode_baseline.cpp
        kernels/cpu/decode_avx2.cpp kernels/cpu/decode_avx512.cpp"
safetensors="runtime/safetensors_header.cpp"
datasets="actors/rl/datasets.cpp actors/rl/tasks.cpp"
job="runtime/config.cpp actors/rl/job_config.cpp actors/rl/role_traits.cpp actors/rl/placement.cpp
     actors/rl/verifiers.cpp actors/rl/stage_table.cpp actors/rl/supervision.cpp actors/rl/data.cpp
     actors/train/strategy_memory.cpp actors/inference/engine_config.cpp models/config.cpp
     models/parallel_plan.cpp models/regex.cpp runtime/pipeline_schedule.cpp
     runtime/transport_traits.cpp $datasets $decode $unicode"

declare -A sources=(
  [heartbeat]="cluster/heartbeats.cpp runtime/inflight.cpp runtime/hash.cpp $base"
  [journal]="actors/job/events.cpp runtime/jsonl.cpp $base"
  [job_yaml]="$job $json $base"
  [tokenizer]="$(cd "$root" && echo models/tokenizer*.cpp) models/regex.cpp $chat $json $base"
  [chat_template]="$chat $base"
  [hf_config]="models/config.cpp $decode $json $base"
  [safetensors]="$safetensors runtime/jsonl.cpp $base"
  [weight_table]="runtime/weight_table.cpp runtime/hash.cpp $safetensors runtime/jsonl.cpp $base"
  [dataset]="$datasets $json $base"
)
declare -A libs=(
  [heartbeat]="-lcaf_core"
  [journal]="-lcaf_core"
  [job_yaml]="-lcaf_core -lonig -lyaml-cpp -lfmt -lspdlog"
  [tokenizer]="-lcaf_core -lonig"
  [chat_template]="-lcaf_core"
  [hf_config]="-lcaf_core"
  [safetensors]="-lcaf_core"
  [weight_table]="-lcaf_core"
  [dataset]="-lcaf_core"
)

targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --minutes) seconds=$(($2 * 60)); shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -n ${sources[$1]+x} ]] || { echo "fuzz.sh: no libFuzzer target '$1' (have: ${!sources[*]})" >&2; exit 2; }
       targets+=("$1"); shift ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(printf '%s\n' "${!sources[@]}" | sort)
# (77: ctest's skip code, for the short run the test suite makes.)
for tool in clang++-14 ninja; do
  command -v $tool >/dev/null || { echo "fuzz.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 77; }
done
cxx=clang++-14
command -v ccache >/dev/null && cxx="ccache clang++-14"

# The Ninja file: one object per source (shared by the targets), one link
# per target.
mkdir -p "$out"
ninja_file=$out/build.ninja
{
  echo "cxx = $cxx"
  echo "flags = -std=c++20 -O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -I$root"
  echo "rule cxx"
  echo "  command = \$cxx \$flags -MMD -MF \$out.d -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "  description = fuzz: compiling \$in"
  echo "rule link"
  echo "  command = clang++-14 -fsanitize=fuzzer,address,undefined \$in \$libs -pthread -o \$out"
  echo "  description = fuzz: linking \$out"
  declare -A seen=()
  for t in "${!sources[@]}"; do
    objs=()
    declare -A mine=()
    for s in tests/fuzz/${t}_fuzz.cpp ${sources[$t]}; do
      o=obj/${s%.cpp}.o
      [[ -n ${mine[$o]+x} ]] && continue
      mine[$o]=1
      objs+=("$o")
      [[ -n ${seen[$o]+x} ]] && continue
      seen[$o]=1
      echo "build $o: cxx $root/$s"
    done
    unset mine
    echo "build bin/$t: link ${objs[*]}"
    echo "  libs = ${libs[$t]}"
  done
} > "$ninja_file.new"
mv "$ninja_file.new" "$ninja_file"
bins=()
for t in "${targets[@]}"; do bins+=("bin/$t"); done
echo "fuzz.sh: building ${targets[*]}"
if ! ninja -C "$out" -j "$jobs" "${bins[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -20 >&2 || true
  echo "fuzz.sh: the build failed; its output: $out/build.log" >&2
  exit 1
fi

failed=0
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$findings/$t"
  dict=()
  [[ -f $root/tests/fuzz/dict/$t.dict ]] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  # The saved reproducers run first, under the sanitizers too.
  saved=()
  [[ -d $root/tests/fuzz/reproducers/$t ]] && saved=("$root/tests/fuzz/reproducers/$t")
  echo "fuzz.sh: running $t for ${seconds} s"
  if ! ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0 \
      TMPDIR=$out "$out/bin/$t" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/$t/" \
      "${dict[@]}" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" "${saved[@]}" 2>"$out/$t.log"; then
    echo "fuzz.sh: $t FAILED; its output: $out/$t.log; its reproducer in $findings/$t/" >&2
    grep -E "ERROR|SUMMARY|runtime error" "$out/$t.log" | head -5 >&2 || true
    failed=1
    continue
  fi
  grep -E "^stat::(number_of_executed_units|peak_rss_mb|new_units_added)|cov:" "$out/$t.log" | tail -4 || true
  rmdir "$findings/$t" 2>/dev/null || true
done
exit $failed
