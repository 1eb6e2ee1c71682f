#!/usr/bin/env bash
# Builds the libFuzzer form of troupe's fuzz targets (NOTE [fuzz targets]
# in tests/fuzz/replay_main.cpp) with AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each from its seed corpus.
#
#   scripts/fuzz.sh [--seconds N | --minutes N] [--jobs N] [--all | TARGET ...]
#
# Default: the torch-free targets (the test suite's run) for 10 seconds
# each, --jobs (2) of them at a time (and as many build jobs); --all adds the six below that link LibTorch and gRPC. A crash, a
# sanitizer report, a leak in troupe's frames (tests/fuzz/lsan.supp lists
# the libraries' static state) or a slow input (over 10 s) fails the run;
# its reproducer is left in tests/fuzz/findings/<target>/
# ($TROUPE_FUZZ_FINDINGS when set; the test suite's run puts them in its
# build folder) (copy it into tests/fuzz/reproducers/<target>/ with the
# fix, so the normal build's replay test keeps it fixed). The corpus each
# run grows stays in build-fuzz/corpus/<target>/; the repository's seeds
# are not touched.
#
# The torch-free targets are built with clang 14: each lists the sources
# it compiles, just its objects, not troupe (compiled once for all targets,
# incrementally, by a Ninja file written here). The targets that need
# LibTorch, gRPC or CAF's network (role messages and tensor batches, the
# JobService and NodeService handlers, the dashboard, a reward service's
# answers) are built with GCC
# in a CMake build of their own, build-fuzz/gcc/, with GCC's coverage hooks
# feeding libFuzzer's engine: Debian's LibTorch 1.13 headers do not compile
# with clang 14 in C++20 (NOTE [gcc fuzz build] in
# tests/fuzz/gcc_coverage.cpp). Its first build compiles most of troupe
# with the sanitizers: about 30 minutes on 2 cores; later ones are
# incremental.
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
     runtime/transport_traits.cpp actors/rl/environment.cpp $datasets $decode $unicode"

declare -A sources=(
  [heartbeat]="cluster/heartbeats.cpp runtime/inflight.cpp runtime/hash.cpp $base"
  [journal]="actors/job/events.cpp runtime/jsonl.cpp $base"
  [job_yaml]="$job $json $base"
  [tokenizer]="$(cd "$root" && echo models/tokenizer*.cpp) models/regex.cpp $chat $json $base"
  [chat_template]="$chat $base"
  [tool_calls]="models/tool_calls.cpp $chat $json $base"
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
  [tool_calls]="-lcaf_core"
  [hf_config]="-lcaf_core"
  [safetensors]="-lcaf_core"
  [weight_table]="-lcaf_core"
  [dataset]="-lcaf_core"
)

# The targets of the GCC build (tests/fuzz/CMakeLists.txt says what each links).
declare -A gcc_built=([role_messages]=1 [job_service]=1 [node_service]=1 [dashboard]=1 [reward_service]=1 [environment_service]=1 [agent_gateway]=1)

targets=()
all=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --minutes) seconds=$(($2 * 60)); shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --all) all=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -n ${sources[$1]+x} || -n ${gcc_built[$1]+x} ]] ||
         { echo "fuzz.sh: no libFuzzer target '$1' (have: ${!sources[*]} ${!gcc_built[*]})" >&2; exit 2; }
       targets+=("$1"); shift ;;
  esac
done
if [[ ${#targets[@]} -eq 0 ]]; then
  mapfile -t targets < <(printf '%s\n' "${!sources[@]}" | sort)
  [[ $all -eq 0 ]] || mapfile -t -O ${#targets[@]} targets < <(printf '%s\n' "${!gcc_built[@]}" | sort)
fi
clang_targets=()
gcc_targets=()
for t in "${targets[@]}"; do
  if [[ -n ${sources[$t]+x} ]]; then clang_targets+=("$t"); else gcc_targets+=("$t"); fi
done
# (77: ctest's skip code, for the short run the test suite makes.)
need=(clang++-14 ninja)
[[ ${#gcc_targets[@]} -eq 0 ]] || need+=(g++ cmake objcopy)
for tool in "${need[@]}"; do
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
# Runs ninja in $1 for the targets after it; on failure shows the errors.
build() {
  local dir=$1
  shift
  echo "fuzz.sh: building $*"
  if ! ninja -C "$dir" -j "$jobs" "$@" >"$dir/build.log" 2>&1; then
    grep -E "error|FAILED" "$dir/build.log" | head -20 >&2 || true
    echo "fuzz.sh: the build failed; its output: $dir/build.log" >&2
    exit 1
  fi
}
declare -A bin=()
if [[ ${#clang_targets[@]} -gt 0 ]]; then
  outs=()
  for t in "${clang_targets[@]}"; do outs+=("bin/$t"); bin[$t]=$out/bin/$t; done
  build "$out" "${outs[@]}"
fi

# The GCC build (NOTE [gcc fuzz build]): libFuzzer's engine with its
# trace-pc hook weakened (tests/fuzz/gcc_coverage.cpp defines the one that
# counts), and troupe configured with the sanitizers and that engine.
if [[ ${#gcc_targets[@]} -gt 0 ]]; then
  gcc_dir=$out/gcc
  mkdir -p "$gcc_dir"
  runtime=$(clang++-14 -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a
  engine=$gcc_dir/libfuzzer_engine.a
  [[ -f $runtime ]] || { echo "fuzz.sh: $runtime is missing (libclang-rt-14-dev)" >&2; exit 77; }
  [[ $engine -nt $runtime ]] || objcopy --weaken-symbol=__sanitizer_cov_trace_pc "$runtime" "$engine"
  if [[ ! -f $gcc_dir/CMakeCache.txt ]]; then
    echo "fuzz.sh: configuring the GCC build in $gcc_dir"
    cmake -S "$root" -B "$gcc_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_CUDA=OFF \
      -DTROUPE_BUILD_BENCH=OFF "-DTROUPE_SANITIZE=address;undefined" \
      -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined -DTROUPE_FUZZ_ENGINE="$engine" \
      >"$gcc_dir/configure.log" 2>&1 ||
      { tail -20 "$gcc_dir/configure.log" >&2; rm -f "$gcc_dir/CMakeCache.txt"; exit 1; }
  fi
  outs=()
  for t in "${gcc_targets[@]}"; do outs+=("troupe_fuzz_$t"); bin[$t]=$gcc_dir/tests/fuzz/troupe_fuzz_$t; done
  build "$gcc_dir" "${outs[@]}"
fi

# Runs target $1; its report (the summary, or why it failed) goes to
# $out/$1.report, and its status is the run's.
run_one() {
  local t=$1
  mkdir -p "$out/corpus/$t" "$findings/$t"
  local dict=()
  [[ -f $root/tests/fuzz/dict/$t.dict ]] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  # The saved reproducers run first, under the sanitizers too.
  local saved=()
  [[ -d $root/tests/fuzz/reproducers/$t ]] && saved=("$root/tests/fuzz/reproducers/$t")
  if ! ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0 \
      TMPDIR=$out "${bin[$t]}" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/$t/" \
      "${dict[@]}" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" "${saved[@]}" 2>"$out/$t.log"; then
    {
      echo "fuzz.sh: $t FAILED; its output: $out/$t.log; its reproducer in $findings/$t/"
      grep -E "ERROR|SUMMARY|runtime error" "$out/$t.log" | head -5 || true
    } >"$out/$t.report"
    return 1
  fi
  # (The last status line: "cov:" edges from clang's counters, "ft:" features from both builds.)
  {
    echo "fuzz.sh: $t"
    grep -E "^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" \
      "$out/$t.log" || true
  } >"$out/$t.report"
  rmdir "$findings/$t" 2>/dev/null || true
}

# The targets run $jobs at a time, each for $seconds.
echo "fuzz.sh: running ${targets[*]} for ${seconds} s each, $jobs at a time"
declare -A pid_of=()
failed=0
for t in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
  run_one "$t" &
  pid_of[$t]=$!
done
for t in "${targets[@]}"; do
  if wait "${pid_of[$t]}"; then
    cat "$out/$t.report"
  else
    cat "$out/$t.report" >&2
    failed=1
  fi
done
exit $failed
