#!/usr/bin/env bash
# The README's main command. Installs what is missing and builds (scripts/setup.sh), then, on 2
# ranks: measures every collective, checks the sharded classifier at 1 and 2 ranks on one
# random case, and times a classifier step. On a node with GPUs the ranks use them (NCCL).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh" --no-tests
bin="$repo/build/bin"
run_dir="$repo/runs/demo"
mkdir -p "$run_dir"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mpirun=(mpirun --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS)
backend=mpi
if command -v nvidia-smi >/dev/null 2>&1 && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then backend=nccl; fi

echo "== collectives on 2 ranks ($backend)"
"${mpirun[@]}" -np 2 "$bin/myriad-bench" collectives --backend "$backend" --max-bytes 16M --factor 16

echo "== sharded classifier: the same case at 1 and 2 ranks"
"$bin/myriad-bench" classifier-case --output "$run_dir/case.h5" --samples 256 --classes 10000 --embedding-size 128
for n in 1 2; do
  "${mpirun[@]}" -np "$n" "$bin/myriad-bench" classifier-check --input "$run_dir/case.h5" \
    --output "$run_dir/check-np$n.h5" --margin arcface
done

echo "== one classifier step on 2 ranks: 100K classes, batch 64 per rank"
"${mpirun[@]}" -np 2 "$bin/myriad-bench" classifier --num-classes 100K --embedding-size 128 --batch-size 64 \
  --steps 5 --warmup 1
