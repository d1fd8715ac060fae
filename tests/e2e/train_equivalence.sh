#!/usr/bin/env bash
# The same global batch on 1, 2 and 4 ranks gives the same losses over the first steps, within
# float32 noise (SyncBN makes batch statistics global; sampling and augmentation depend on the
# sample, not the rank).
#   tests/e2e/train_equivalence.sh BIN_DIR
source "$(dirname "$0")/common.sh"
for n in 1 2 4; do
  small_train "$n" --batch-size $((32 / n)) --max-steps 6 --log-every 1 --lr 0.01 --sync-bn --margin arcface \
    --scale 16 --m2 0.3 --run-dir "$work/np$n"
  losses "$work/np$n" >"$work/loss$n"
done
for n in 2 4; do
  paste "$work/loss1" "$work/loss$n" | awk -v n="$n" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1); if (r > worst) worst = r
      printf "step %d: 1 rank %.9g, %d ranks %.9g\n", NR, $1, n, $2 }
    END { if (NR != 6) { print "expected 6 steps, got " NR; exit 1 }
          printf "largest relative difference at %d ranks: %.2g\n", n, worst; exit !(worst < 1e-5) }'
done
echo "equivalence e2e: OK"
