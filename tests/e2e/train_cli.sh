#!/usr/bin/env bash
# myriad-train end to end on 2 ranks: the loss falls on generated data, the run directory holds
# the configuration (which --config reads back) and the metrics, and bad input fails on every
# rank with one error line and the documented exit code.
#   tests/e2e/train_cli.sh BIN_DIR
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-train" "$@"; }
common=(--data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 50
        --batch-size 16 --workers 1 --threads 1 --margin cosface --scale 16 --m3 0.2)

run "${common[@]}" --max-steps 80 --log-every 10 --lr 0.05 --run-dir "$work/run" --log-level warn
loss() { grep '"kind":"train"' "$work/run/metrics.jsonl" | sed -n "$1p" | sed -E 's/.*"loss":([-0-9.eE+]+).*/\1/'; }
first=$(loss 1)
last=$(loss 8)
awk -v a="$first" -v b="$last" 'BEGIN { printf "loss %.4f -> %.4f\n", a, b; exit !(b < 0.5 * a) }'
for key in step epoch loss lr samples_per_sec time_ms eta_sec; do
  grep -q "\"$key\"" "$work/run/metrics.jsonl" || { echo "metrics.jsonl lacks $key"; exit 1; }
done
grep -q "^backbone = smallcnn$" "$work/run/config.ini"
# The saved configuration reproduces the run's options.
run --config "$work/run/config.ini" --max-steps 2 --run-dir "$work/again" --log-level warn
grep -q "^m3 = 0.2" "$work/again/config.ini"

expect_failure() {
  local code=$1 pattern=$2
  shift 2
  set +e
  output=$(run "$@" 2>&1)
  status=$?
  set -e
  [ "$status" -eq "$code" ] || { echo "$output"; echo "expected exit $code, got $status"; exit 1; }
  [ "$(grep -c "error:" <<<"$output")" -eq 1 ] || { echo "$output"; echo "expected one error line"; exit 1; }
  grep -q -- "$pattern" <<<"$output" || { echo "$output"; echo "error does not mention '$pattern'"; exit 1; }
}
expect_failure 2 "unrecognised option '--epochz'" --epochz 3
expect_failure 2 "precision must be auto, fp32, bf16 or fp16" --precision fp8
for steps in 5 3:2 0:4 a:b 2:; do
  expect_failure 2 "--profile-steps must be FIRST:LAST with 1 <= FIRST <= LAST, got '$steps'" --profile-steps "$steps"
done
expect_failure 1 "'$work/missing.h5' does not exist" --data "$work/missing.h5" --input-shape 1x16x16
echo "not hdf5" >"$work/garbage.h5"
expect_failure 1 "is not an HDF5 file" --data "$work/garbage.h5"
# A small real dataset: 40 random 8x8 images of 5 classes, through IDX and myriad-data.
{ printf '\x00\x00\x08\x03\x00\x00\x00\x28\x00\x00\x00\x08\x00\x00\x00\x08'; head -c 2560 /dev/urandom; } >"$work/images.idx"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x28'; for i in $(seq 0 39); do printf "\\x0$((i % 5))"; done; } >"$work/labels.idx"
"$bin/myriad-data" from-idx --images "$work/images.idx" --labels "$work/labels.idx" --output "$work/small.h5" 2>/dev/null
expect_failure 1 "holds 1x8x8 images but --input-shape is 1x16x16" --data "$work/small.h5" --input-shape 1x16x16 \
  --backbone smallcnn
expect_failure 1 "num-classes 3 is smaller than the 5 classes" --data "$work/small.h5" --input-shape 1x8x8 \
  --backbone smallcnn --num-classes 3
echo "train cli e2e: OK"
