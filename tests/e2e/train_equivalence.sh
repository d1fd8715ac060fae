#!/usr/bin/env bash
# The same global batch on 1, 2 and 4 ranks gives the same losses over the first steps, within
# float32 noise (SyncBN makes batch statistics global; sampling and augmentation depend on the
# sample, not the rank).
#   tests/e2e/train_equivalence.sh BIN_DIR
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for n in 1 2 4; do
  mpirun --oversubscribe --bind-to none -np "$n" "$bin/myriad-train" --data synthetic --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --batch-size $((32 / n)) --max-steps 6 --log-every 1 \
    --lr 0.01 --sync-bn --margin arcface --scale 16 --m2 0.3 --workers 1 --threads 1 --run-dir "$work/np$n" \
    --log-level warn
  grep -o '"loss":[-0-9.eE+]*' "$work/np$n/metrics.jsonl" | cut -d: -f2 >"$work/loss$n"
done
for n in 2 4; do
  paste "$work/loss1" "$work/loss$n" | awk -v n="$n" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1); if (r > worst) worst = r
      printf "step %d: 1 rank %.9g, %d ranks %.9g\n", NR, $1, n, $2 }
    END { if (NR != 6) { print "expected 6 steps, got " NR; exit 1 }
          printf "largest relative difference at %d ranks: %.2g\n", n, worst; exit !(worst < 1e-5) }'
done
echo "equivalence e2e: OK"
