#!/usr/bin/env bash
# IJB-C 1:1 verification end to end at IJB-C's size, as docs/benchmarks.md records it: a synthetic
# set in insightface's layout (myriad-data synthetic-ijb: 469,375 loose crops, 23,124 templates,
# 15,658,489 pairs), its conversion (myriad-data from-ijb: decode, align, write), and myriad-eval
# ijb of an iresnet100 (weights from a one-step run: the time does not depend on them), each timed.
#
#   scripts/bench-ijb.sh [--bin DIR] [--dir DIR] [--ranks N] [--precision P] [--batch-size B]
#                        [--images N --templates T --pairs P]
#
#   --bin         the executables (default build/bin)
#   --dir         where the set, the converted file and the weights are written (default
#                 build/bench-ijb; the set and the weights are made once and kept)
#   --ranks       ranks of myriad-eval ijb, one per GPU (default 1)
#   --precision   myriad-eval's --precision (default bf16)
#   --batch-size  images per rank and batch of myriad-eval (default 512)
#   --images, --templates, --pairs   a smaller set (default IJB-C's size)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$repo/build/bin
dir=$repo/build/bench-ijb
ranks=1
precision=bf16
batch=512
images=469375
templates=23124
pairs=15658489
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --templates) templates=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench-ijb.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
forward=()
for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
  [ -n "${!v:-}" ] && forward+=(-x "$v")
done
# Seconds a command takes, its output in LOG.
timed() {
  local log=$1 start
  shift
  start=$(date +%s%N)
  "$@" >"$log" 2>&1 || { echo "bench-ijb.sh: failed, see $log:" >&2; tail -n 5 "$log" >&2; exit 1; }
  local ms=$((($(date +%s%N) - start) / 1000000))
  printf '%d.%01d\n' $((ms / 1000)) $((ms % 1000 / 100))
}

set_dir=$dir/ijbc-$images
if [ ! -f "$set_dir/meta/ijbc_template_pair_label.txt" ]; then
  make_s=$(timed "$dir/synthetic-ijb.log" "$bin/myriad-data" synthetic-ijb --output "$set_dir" \
    --target IJBC --images "$images" --templates "$templates" --pairs "$pairs")
  echo "synthetic-ijb: $images crops, $templates templates, $pairs pairs in ${make_s} s ($(du -sh "$set_dir" | cut -f1))"
fi
weights=$dir/r100
if [ ! -f "$weights/checkpoints/LATEST" ]; then
  timed "$dir/weights.log" mpirun -np 1 --bind-to none "${forward[@]}" "$bin/myriad-train" \
    --data synthetic-resident --backbone iresnet100 --num-classes 1000 --batch-size 64 \
    --max-steps 1 --checkpoint-every 1 --run-dir "$weights" >/dev/null
fi
rm -f "$dir/ijbc.h5"
sync
convert_s=$(timed "$dir/from-ijb.log" "$bin/myriad-data" from-ijb "$set_dir" --target IJBC \
  --output "$dir/ijbc.h5")
echo "from-ijb: $images crops decoded, aligned and written in ${convert_s} s on $(nproc) cores ($(du -h "$dir/ijbc.h5" | cut -f1))"
grep -E "images/s" "$dir/from-ijb.log" | tail -n 1
eval_s=$(timed "$dir/eval.log" mpirun -np "$ranks" --bind-to none "${forward[@]}" "$bin/myriad-eval" ijb \
  --data "$dir/ijbc.h5" --checkpoint "$weights/checkpoints" --precision "$precision" \
  --batch-size "$batch" --output "$dir/report.json")
echo "myriad-eval ijb: iresnet100, $precision, $ranks rank(s), batch $batch: ${eval_s} s end to end"
sed -n "/1:1 verification/,\$p" "$dir/eval.log" | grep -v "%|"
