#!/usr/bin/env bash
# Runs every test of myriad: installs what is missing and builds (scripts/setup.sh, which takes
# the same arguments), then runs CTest: unit tests, the multi-rank tests at 1 to 4 ranks, and the
# end-to-end tests. Before the tests it builds the library and executables a second time, without
# the precompiled header and with warnings as errors (BUILD_DIR-nopch). Exits non-zero on any
# failure.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$repo/build"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = --build-dir ] && build_dir=${args[$((i + 1))]}
done

"$repo/scripts/setup.sh" "$@"
# Every file must include what it uses: the precompiled <torch/torch.h> hides a missing include
# that another LibTorch's headers do not pull in (the GPU image's build once failed on one). The
# tests are not built a second time; the summary below is CTest's.
# Unoptimised: it checks includes and warnings, and runs nothing; optimising every translation unit
# of LibTorch's headers again would double CI's build time on its two cores.
"$repo/scripts/setup.sh" --build-dir "$build_dir-nopch" --no-tests -- -DMYRIAD_PCH=OFF -DMYRIAD_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG"

# Open MPI refuses to start as root without these; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Multi-rank tests oversubscribe the cores, so they run one at a time.
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error

