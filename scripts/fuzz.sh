#!/usr/bin/env bash
# Fuzzes every reader of outside bytes with libFuzzer (fuzz/README.md): builds the harnesses with
# clang and the address and undefined-behaviour sanitizers into build-fuzz/, runs each for SECONDS
# (default 600), merges new coverage into fuzz/corpus/NAME, and writes libFuzzer's final
# statistics to docs/fuzzing/NAME.txt. A crash, hang, leak or excess memory leaves its input in
# build-fuzz/findings/NAME/ and makes the script exit 1.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]        (default: all harnesses of fuzz/CMakeLists.txt)
#
# FUZZ_JOBS harnesses run at once (default: the number of cores).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-600}
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: SECONDS must be a positive number, not '$seconds'" >&2; exit 2; }
shift || true
all=$(sed -n 's/^set(MYRIAD_FUZZ_HARNESSES \(.*\))$/\1/p' "$repo/fuzz/CMakeLists.txt")
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || read -r -a harnesses <<<"$all"
for h in "${harnesses[@]}"; do
  [[ " $all " == *" $h "* ]] || { echo "fuzz.sh: no harness '$h' (harnesses: $all)" >&2; exit 2; }
done
jobs=${FUZZ_JOBS:-$(nproc)}
build="$repo/build-fuzz"

# clang 14 with libFuzzer and the sanitizer runtimes, and the libraries the readers use.
wanted=(clang libfuzzer-14-dev libclang-rt-14-dev cmake ninja-build libtorch-dev libhdf5-dev
        nlohmann-json3-dev libturbojpeg0-dev libpng-dev zlib1g-dev)
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "[fuzz] installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMYRIAD_FUZZ=ON >/dev/null
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz-$h"); done
echo "[fuzz] building ${targets[*]}"
cmake --build "$build" -j "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" --target "${targets[@]}"

# Leaks are findings; the only suppressions allowed are for libraries' own globals (none needed
# so far: fuzz/lsan.supp is empty).
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=1
export LSAN_OPTIONS=suppressions=$repo/fuzz/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1
mkdir -p "$repo/docs/fuzzing"
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)

fuzz_one() {
  local h=$1
  local work="$build/corpus/$h" findings="$build/findings/$h/" log="$build/logs/$h.log"
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  local flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048
               -print_final_stats=1 -artifact_prefix="$findings")
  local status=0
  "$build/bin/fuzz-$h" "${flags[@]}" "$work" "$repo/fuzz/corpus/$h" "$repo/fuzz/regressions/$h" \
    >"$log" 2>&1 || status=$?
  # Inputs that add coverage join the committed corpus, which CI replays.
  "$build/bin/fuzz-$h" -merge=1 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    "$repo/fuzz/corpus/$h" "$work" >>"$log.merge" 2>&1 || true
  {
    echo "# libFuzzer, harness $h: $seconds s at $commit on $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# $(clang --version | head -n1); $(nproc --all) cores, $jobs harnesses at once"
    echo "# flags: -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined ${flags[*]:0:4}"
    echo "# exit status $status; corpus fuzz/corpus/$h: $(ls "$repo/fuzz/corpus/$h" | wc -l) inputs"
    grep -E "^#[0-9]+ +DONE|^stat::|^Done [0-9]+ runs" "$log" || true
    if [ "$status" -ne 0 ]; then grep -E "ERROR|SUMMARY|artifact|==[0-9]+==" "$log" | head -n 20; fi
  } >"$repo/docs/fuzzing/$h.txt"
  echo "[fuzz] $h: exit $status, $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | cut -d' ' -f2) runs"
  return "$status"
}

failed=0
running=0
pids=()
names=()
for h in "${harnesses[@]}"; do
  fuzz_one "$h" &
  pids+=($!)
  names+=("$h")
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait "${pids[0]}" || { echo "[fuzz] FINDING in ${names[0]}: see $build/findings/${names[0]}/" >&2; failed=1; }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
    running=$((running - 1))
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "[fuzz] FINDING in ${names[$i]}: see $build/findings/${names[$i]}/" >&2; failed=1; }
done
echo "[fuzz] statistics in docs/fuzzing/; corpora in fuzz/corpus/"
exit "$failed"
