#!/usr/bin/env bash
# The data loader's images per second to one rank (myriad-bench loader: read, decode, flip,
# normalise), as docs/benchmarks.md records them: 112x112 RGB images raw in a file larger than
# myriad-train holds in memory (read directly from the file), the same raw images held in memory,
# and the same images as JPEG, each at several worker counts.
#
#   scripts/bench-loader.sh [--bin DIR] [--dir DIR] [--images N] [--workers LIST] [--steps N]
#
#   --bin      the executables (default build/bin)
#   --dir      where the data files are written, once (default build/bench-loader)
#   --images   images per file, a multiple of 40 (default 40000: 1.5 GB raw, over the 1 GiB held
#              in memory; 40 views of each prototype class)
#   --workers  comma list of loader threads per rank (default 1,2,4,8)
#   --steps    batches of 256 timed per measurement (default 40)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$repo/build/bin
dir=$repo/build/bench-loader
images=40000
workers=1,2,4,8
steps=40
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-loader.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for kind in raw jpeg; do
  [ -f "$dir/$kind.h5" ] && continue
  quality=0
  [ "$kind" = jpeg ] && quality=90
  "$bin/myriad-data" synthetic --output "$dir/$kind.h5" --size "$images" --num-classes $((images / 40)) \
    --input-shape 3x112x112 --prototypes --images-per-class 40 --jpeg-quality "$quality" --log-level warn
done
echo "# myriad-bench loader, 1 rank, batch 256, $steps batches; $(nproc) cores; $(du -h "$dir/raw.h5" | cut -f1) raw, $(du -h "$dir/jpeg.h5" | cut -f1) JPEG"
printf '%-26s' "images/s at workers:"
IFS=, read -r -a counts <<<"$workers"
for w in "${counts[@]}"; do printf '%10s' "$w"; done
echo
for setting in "raw, read directly:raw:0" "raw, held in memory:raw:1T" "JPEG:jpeg:1G"; do
  IFS=: read -r name kind limit <<<"$setting"
  printf '%-26s' "$name"
  for w in "${counts[@]}"; do
    rate=$(mpirun -np 1 --bind-to none "$bin/myriad-bench" loader --data "$dir/$kind.h5" --workers "$w" \
      --batch-size 256 --steps "$steps" --resident-limit "$limit" | sed -nE 's/^images\/s per rank \(rank 0\): ([0-9]+).*/\1/p')
    printf '%10s' "$rate"
  done
  echo
done
