#!/usr/bin/env bash
# The same global batch on 1, 2 and 4 ranks gives the same losses over the first steps, within
# float32 noise (SyncBN makes batch statistics global; sampling and augmentation depend on the
# sample, not the rank); so do 2 ranks computing in the channels-last layout, runs that clip the
# gradient, and, within their rounding, runs that all-reduce it in bf16 or fp16. A run on the resident
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
# compare REFERENCE RUN TOLERANCE: the largest relative difference of the losses, at most TOLERANCE.
compare() {
  paste "$work/loss-$1" "$work/loss-$2" | awk -v a="$1" -v b="$2" -v tolerance="$3" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1); if (r > worst) worst = r
      printf "step %d: %s %.9g, %s %.9g\n", NR, a, $1, b, $2 }
    END { if (NR != 6) { print "expected 6 steps, got " NR; exit 1 }
          printf "largest relative difference of %s against %s: %.2g\n", b, a, worst; exit !(worst < tolerance) }'
}
for n in 2 4 2-channels-last; do compare np1 "np$n" 1e-5; done

# Clipping (--grad-clip) acts on the global gradient, whatever the ranks: the same losses on 1, 2
# and 4 ranks, and other losses than without it (the norm here is far above 0.01).
for n in 1 2 4; do equivalence_run "np$n-clip" "$n" --grad-clip 0.01; done
for n in 2 4; do compare np1-clip "np$n-clip" 1e-5; done
if compare np1 np1-clip 1e-4 >/dev/null; then echo "--grad-clip 0.01 changed nothing"; exit 1; fi
# Gradients all-reduced in bf16 or fp16 (--grad-comm-dtype): within their rounding.
for dtype in bf16 fp16; do
  equivalence_run "np4-$dtype" 4 --grad-comm-dtype "$dtype"
  compare np1 "np4-$dtype" 1e-3
done
data=synthetic-resident equivalence_run resident 1
[ "$(wc -l <"$work/loss-resident")" -eq 6 ] || { echo "the resident run logged no 6 steps"; exit 1; }
paste "$work/loss-np1" "$work/loss-resident" | head -n 1 | awk '
  { d = $1 - $2; if (d < 0) d = -d; printf "first loss: loader %.9g, resident %.9g\n", $1, $2
    exit !(d / $1 < 1e-6) }'
echo "equivalence e2e: OK"
