#!/usr/bin/env bash
# myriad-bench classifier-check end to end: the same HDF5 case gives the same loss and gradients
# at 1 and 3 ranks, and a missing input fails on every rank with one error line and no output.
#   tests/e2e/classifier_check.sh BIN_DIR
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { mpirun --oversubscribe --bind-to none -np "$@"; }

"$bin/myriad-bench" classifier-case --output "$work/case.h5" --samples 40 --classes 53 --embedding-size 16 --seed 3
for n in 1 3; do
  run "$n" "$bin/myriad-bench" classifier-check --input "$work/case.h5" --output "$work/out$n.h5" \
    --margin combined --m1 1.1 --m2 0.3 --m3 0.1 --device cpu
done
# Gradients reach 10 in magnitude; the summation order differs between world sizes (and BLAS
# blocking between shard shapes), within float32 rounding: about 2e-7 of the largest value.
for dataset in /loss /grad_features /grad_weight; do
  "$bin/h5check" equal "$work/out1.h5" "$work/out3.h5" "$dataset" --delta 1e-5
done

set +e
output=$(run 2 "$bin/myriad-bench" classifier-check --input "$work/missing.h5" --output "$work/bad.h5" 2>&1)
code=$?
set -e
[ "$code" -ne 0 ] || { echo "a missing input exited 0"; exit 1; }
errors=$(grep -c "error:" <<<"$output" || true)
[ "$errors" -eq 1 ] || { echo "expected one error line, got $errors:"; echo "$output"; exit 1; }
grep -q "missing.h5' does not exist" <<<"$output" || { echo "the error does not name the file:"; echo "$output"; exit 1; }
if ls "$work"/bad.h5* >/dev/null 2>&1; then echo "a partial output was left behind"; exit 1; fi
echo "classifier-check e2e: OK"
