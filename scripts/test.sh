#!/usr/bin/env bash
# Runs every test of myriad: installs what is missing and builds (scripts/setup.sh, which takes
# the same arguments), then runs CTest: unit tests, the multi-rank tests at 1 to 4 ranks, and the
# end-to-end tests. Exits non-zero on any failure.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$repo/build"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = --build-dir ] && build_dir=${args[$((i + 1))]}
done

"$repo/scripts/setup.sh" "$@"

# Open MPI refuses to start as root without these; CI machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Multi-rank tests oversubscribe the cores, so they run one at a time.
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error
