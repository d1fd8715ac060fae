#!/usr/bin/env bash
# The same global batch on 1, 2 and 4 ranks gives the same losses over the first steps, within
# float32 noise (SyncBN makes batch statistics global; sampling and augmentation depend on the
# sample, not the rank); so do 2 ranks computing in the channels-last layout. A run on the resident
# batch (--data synthetic-resident) starts from the loader's first batch: the same first loss.
#   tests/e2e/train_equivalence.sh BIN_DIR
source "$(dirname "$0")/common.sh"
equivalence_run() {
  local name=$1 n=$2
  shift 2
  small_train "$n" --batch-size $((32 / n)) --max-steps 6 --log-every 1 --lr 0.01 --sync-bn --margin arcface \
    --scale 16 --m2 0.3 --run-dir "$work/$name" "$@"
  losses "$work/$name" >"$work/loss-$name"
}
equivalence_run np1 1
equivalence_run np2 2
equivalence_run np4 4
equivalence_run np2-channels-last 2 --channels-last on
grep -q "^channels-last = on" "$work/np2-channels-last/config.ini"
for n in 2 4 2-channels-last; do
  paste "$work/loss-np1" "$work/loss-np$n" | awk -v n="$n" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1); if (r > worst) worst = r
      printf "step %d: 1 rank %.9g, %d ranks %.9g\n", NR, $1, n, $2 }
    END { if (NR != 6) { print "expected 6 steps, got " NR; exit 1 }
          printf "largest relative difference at %d ranks: %.2g\n", n, worst; exit !(worst < 1e-5) }'
done
data=synthetic-resident equivalence_run resident 1
[ "$(wc -l <"$work/loss-resident")" -eq 6 ] || { echo "the resident run logged no 6 steps"; exit 1; }
paste "$work/loss-np1" "$work/loss-resident" | head -n 1 | awk '
  { d = $1 - $2; if (d < 0) d = -d; printf "first loss: loader %.9g, resident %.9g\n", $1, $2
    exit !(d / $1 < 1e-6) }'
echo "equivalence e2e: OK"
