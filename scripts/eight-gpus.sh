#!/usr/bin/env bash
# The runs of one full 8-GPU node (nvidia-h200-x8 or nvidia-h100-x8), in two device calls of at
# most 10 minutes each (docs/benchmarks.md takes their figures):
#
#   scripts/eight-gpus.sh --part tests --deps-dir DIR --out DIR   # every test at 1 to 8 ranks
#   scripts/eight-gpus.sh --part bench --out DIR                  # after a build (the tests part)
#
# tests: scripts/gpu-check.sh --only tests, whose multi-rank tests run at 1, 2, 3, 4 and 8 ranks
# on 8 GPUs, NCCL variants included. bench: weak scaling of iresnet50 and iresnet100 (bf16) at 1,
# 2, 4 and 8 GPUs with CUDA graphs on and off; the classifier at C = 8M, 64M and 512M with 128
# and 512 per GPU and the largest C with bf16 weights and momentum; the collectives beside
# nccl-tests' all_reduce_perf where the node has it; myriad-doctor --model-table for 2, 4 and 8
# GPUs, to set beside the measured steps.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
part=""
out=${OUT:-$repo/build/eight-gpus}
deps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --part) part=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deps-dir) deps=(--deps-dir "$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "eight-gpus.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ "$part" = tests ] || [ "$part" = bench ] || { echo "eight-gpus.sh: --part must be tests or bench" >&2; exit 2; }
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
[ "$gpus" -ge 8 ] || { echo "eight-gpus.sh: needs 8 GPUs, this node has $gpus" >&2; exit 1; }
mkdir -p "$out"

if [ "$part" = tests ]; then
  exec "$repo/scripts/gpu-check.sh" "${deps[@]}" --out "$out/check" --only tests
fi

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ -d /tmp/myriad-deps ]; then
  export LD_LIBRARY_PATH="$(ls -d /tmp/myriad-deps/usr/lib/*-linux-gnu | head -n1):${LD_LIBRARY_PATH:-}"
fi
forward=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x LD_LIBRARY_PATH)
bin=$repo/build/bin
[ -x "$bin/myriad-train" ] || { echo "eight-gpus.sh: no $bin/myriad-train (run --part tests first)" >&2; exit 1; }
status=0

for graphs in on off; do
  "$repo/scripts/bench-train.sh" --bin "$bin" --out "$out/bench-train" --backbones iresnet50,iresnet100 \
    --gpus 1,2,4,8 --precisions bf16 --label "cuda-graphs-$graphs" -- --cuda-graphs "$graphs" || status=1
done
classifier() {
  local name=$1
  shift
  mpirun -np 8 --bind-to none "${forward[@]}" "$bin/myriad-bench" classifier --momentum-dtype bf16 \
    --weight-dtype bf16 --workspace 48G --steps 10 --warmup 3 "$@" >"$out/classifier-$name.txt" 2>&1 || status=1
  echo "classifier $name:"; grep -E "^(step time|floor|peak memory|largest)|error" "$out/classifier-$name.txt"
}
for c in 8M 64M 512M; do
  for b in 128 512; do classifier "$c-b$b" --num-classes "$c" --batch-size "$b" --profile; done
done
classifier max-classes --num-classes 8M --batch-size 128 --find-max-classes
mpirun -np 8 --bind-to none "${forward[@]}" "$bin/myriad-bench" collectives --backend nccl --min-bytes 1K \
  --max-bytes 1G --factor 4 --iters 20 >"$out/collectives.txt" 2>&1 || status=1
if command -v all_reduce_perf >/dev/null 2>&1; then
  mpirun -np 8 --bind-to none "${forward[@]}" all_reduce_perf -b 1K -e 1G -f 4 -g 1 >"$out/nccl-tests.txt" 2>&1 || status=1
else
  echo "no nccl-tests (all_reduce_perf) on this node: myriad-bench collectives alone" | tee "$out/nccl-tests.txt"
fi
# The model's rows for 2, 4 and 8 GPUs of one host, on H200s (4.8 TB/s), against bench-train's steps.
"$bin/myriad-doctor" --model-table --table-gpus 2,4,8 --gpus-per-host 8 --memory-tbps 4.8 \
  --gpu-memory 139G >"$out/model-table.txt" 2>&1 || status=1
exit "$status"
