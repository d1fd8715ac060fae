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
"$repo/scripts/check-includes.py" "$build_dir-nopch/compile_commands.json"

# Open MPI refuses to start as root without these; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Multi-rank tests oversubscribe the cores, so they run one at a time.
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error

