#!/usr/bin/env bash
# Accuracy with many classes, measured (issue 20): prototype data (myriad-data synthetic
# --prototypes) of 2K classes, 8 training views each, 1x16x16; a held-out set of 2 other views per
# class and 3000 verification pairs of held-out views. smallcnn trained on 2 ranks (one thread
# each) for 400 steps must reach a held-out top-1 and a 10-fold verification accuracy far above
# what the same run after one step gets, and bf16 classifier weights (--classifier-weight-dtype
# bf16, stochastic rounding) must match fp32 weights within 1.5 points. The measurements behind
# the thresholds: docs/benchmarks.md, "Accuracy at scale".
#   tests/e2e/prototype_accuracy.sh BIN_DIR
source "$(dirname "$0")/common.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
classes=2000
start=$SECONDS

# Bad combinations are usage errors (exit 2) that say what is wrong.
usage_error() {
  local expected=$1 output
  shift
  if output=$("$bin/myriad-data" synthetic --input-shape 1x16x16 --output "$work/bad.h5" "$@" 2>&1); then
    fail "myriad-data synthetic $* succeeded"
  else
    [ $? -eq 2 ] && grep -q -- "$expected" <<<"$output" || fail "myriad-data synthetic $*: $output"
  fi
}
usage_error "--images-per-class needs --prototypes" --images-per-class 8
usage_error "--images-per-class must be positive" --prototypes --images-per-class 0
usage_error "--pairs must be at least 10" --prototypes --pairs-output "$work/bad-pairs.h5" --pairs 4
[ ! -e "$work/bad.h5" ] || fail "a refused command left a file"

generate() {
  "$bin/myriad-data" synthetic --prototypes --num-classes "$classes" --input-shape 1x16x16 "$@" \
    >"$work/generate.log" 2>&1 || { cat "$work/generate.log" >&2; fail "myriad-data synthetic --prototypes $*"; }
}
generate --images-per-class 8 --output "$work/train.h5"
# Views 8 and 9 of every class, and pairs of views from 8 on: none of them in training.
generate --images-per-class 2 --views-from 8 --output "$work/heldout.h5" --pairs-output "$work/pairs.h5" --pairs 3000

# accuracy_run NAME STEPS [myriad-train options]: trains, then prints "TOP1 VERIFICATION" in percent
# from the final evaluation in metrics.jsonl.
accuracy_run() {
  local name=$1 steps=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-train" --data "$work/train.h5" --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 64 --workers 1 --threads 1 --device cpu --batch-size 128 \
    --max-steps "$steps" --warmup-steps 30 --lr 0.2 --margin cosface --scale 32 --m3 0.2 --log-every 100 \
    --val-data "$work/heldout.h5" --eval-pairs "$work/pairs.h5" --log-level warn --run-dir "$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; fail "$name: myriad-train failed"; }
  local record
  record=$(grep '"kind":"eval"' "$work/$name/metrics.jsonl" | tail -n 1)
  [ -n "$record" ] || fail "$name: no evaluation in metrics.jsonl"
  awk -v r="$record" 'BEGIN {
    if (!match(r, /"top1":[-0-9.eE+]+/)) exit 1; top1 = substr(r, RSTART + 7, RLENGTH - 7)
    if (!match(r, /"pairs":\{"accuracy":[-0-9.eE+]+/)) exit 1; v = substr(r, RSTART + 20, RLENGTH - 20)
    printf "%.2f %.2f\n", 100 * top1, 100 * v }' || fail "$name: no top1 or pairs accuracy in '$record'"
}
# check NAME VALUE OP LIMIT TEXT: fails with TEXT unless VALUE OP LIMIT (< or >).
check() { awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN { exit !(op == ">" ? v > l : v < l) }' || fail "$1: $5"; }

# After one step the network is a random one: top-1 at chance (1/C = 0.05%), and verification
# well above 50% all the same, since a random CNN keeps much of the similarity of the pixels (the
# prototypes are smooth, the noise is not). Measured: 0.03% and 82.7%.
result=$(accuracy_run untrained 1)
read -r top1 verification <<<"$result"
echo "one step: top-1 $top1%, verification $verification% (chance: top-1 0.05%, verification 50%)"
check untrained "$top1" "<" 1 "top-1 $top1% after one step: the evaluation does not measure learning"
check untrained "$verification" "<" 92 "verification $verification% after one step"

# Measured with 4 seeds: top-1 93.0-94.0%, verification 98.6-99.1%.
result=$(accuracy_run fp32 400 --classifier-weight-dtype fp32)
read -r top1 verification <<<"$result"
echo "fp32 weights: top-1 $top1%, verification $verification%"
check fp32 "$top1" ">" 85 "held-out top-1 $top1% is not far above chance"
check fp32 "$verification" ">" 97 "verification $verification% is not far above the untrained network's"

result=$(accuracy_run bf16 400 --classifier-weight-dtype bf16)
read -r bf16_top1 bf16_verification <<<"$result"
echo "bf16 weights: top-1 $bf16_top1%, verification $bf16_verification%"
# Measured with 4 seeds: bf16 and fp32 weights of one seed differ by at most 0.36 points in
# top-1 and 0.27 in verification, and the 8 runs span 1.4 points of top-1: 1.5 is 4 times the
# largest difference within a seed and about the spread across seeds.
awk -v a="$top1" -v b="$bf16_top1" -v c="$verification" -v d="$bf16_verification" 'BEGIN {
  t = a - b; if (t < 0) t = -t; v = c - d; if (v < 0) v = -v
  printf "bf16 - fp32: top-1 %+.2f, verification %+.2f points (tolerance 1.5)\n", b - a, d - c
  exit !(t <= 1.5 && v <= 1.5) }' || fail "bf16 classifier weights are not within 1.5 points of fp32"
echo "prototype accuracy e2e: OK ($((SECONDS - start)) s)"
