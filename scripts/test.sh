#!/usr/bin/env bash
# Runs every test of myriad: installs what is missing and builds (scripts/setup.sh, which takes
# the same arguments), then runs CTest: unit tests, the multi-rank tests at 1 to 4 ranks, and the
# end-to-end tests. Before the tests it compiles the library and executables a second time, for
# syntax only, without the precompiled header and with warnings as errors (BUILD_DIR-nopch). Exits
# non-zero on any failure.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$repo/build"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = --build-dir ] && build_dir=${args[$((i + 1))]}
done

"$repo/scripts/setup.sh" "$@"
# Every file must include what it uses: the precompiled <torch/torch.h> hides a missing include
# that another LibTorch's headers do not pull in (the GPU image's build once failed on one). So each
# translation unit of the library, the apps and the tools is compiled again without the
# precompiled header and with warnings as errors, for syntax only: parsing is what the check needs,
# and code generation would only add to CI's time.
"$repo/scripts/setup.sh" --build-dir "$build_dir-nopch" --no-tests --configure-only -- \
  -DMYRIAD_PCH=OFF -DMYRIAD_WERROR=ON
python3 - "$build_dir-nopch/compile_commands.json" <<'PY'
import concurrent.futures, json, os, re, subprocess, sys
units = [u for u in json.load(open(sys.argv[1])) if u["file"].endswith(".cpp")]
def check(unit):
    command = re.sub(r" -o \S+", "", unit["command"]) + " -fsyntax-only"
    done = subprocess.run(command, shell=True, cwd=unit["directory"], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr
with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
    results = list(pool.map(check, units))
failed = [out for code, out in results if code != 0]
print("".join(failed), end="")
print(f"[test] {len(units)} translation units without the precompiled header, warnings as errors: "
      f"{len(failed)} failed")
sys.exit(1 if failed else 0)
PY

# Open MPI refuses to start as root without these; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Multi-rank tests oversubscribe the cores, so they run one at a time.
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error

