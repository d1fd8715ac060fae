#!/usr/bin/env bash
# myriad-data from-folder and inspect end to end: a tree of JPEG and PNG files becomes an HDF5
# dataset of the unchanged bytes that trains; a corrupt file is an error naming it and leaves no
# output behind.
#   tests/e2e/data_tools.sh BIN_DIR MAKE_IMAGE_TREE
set -euo pipefail
bin=$1
make_tree=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$make_tree" "$work/tree" 3 5
"$bin/myriad-data" from-folder --input "$work/tree" --output "$work/set.h5" --workers 2
report=$("$bin/myriad-data" inspect "$work/set.h5")
echo "$report"
grep -q "^images     15$" <<<"$report"
grep -q "^shape      16x12x3" <<<"$report"
grep -q "encoded: 9 JPEG, 6 PNG" <<<"$report"
grep -q "^classes    3 (num_classes), 3 with images" <<<"$report"
grep -q "histogram  0:5 1:5 2:5" <<<"$report"
# The stored bytes are the files' own, with their classes.
"$bin/h5check" equal "$work/set.h5" "$work/tree.expected.h5" /images
"$bin/h5check" equal "$work/set.h5" "$work/tree.expected.h5" /labels
mpirun --oversubscribe -np 2 "$bin/myriad-train" --data "$work/set.h5" --val-data "$work/set.h5" \
  --input-shape 3x16x12 --backbone smallcnn --embedding-size 8 --batch-size 4 --max-steps 3 --workers 1 \
  --threads 1 --run-dir "$work/run" --log-level warn
grep -q '"kind":"eval"' "$work/run/metrics.jsonl"

"$make_tree" "$work/bad" 2 3 corrupt
set +e
output=$("$bin/myriad-data" from-folder --input "$work/bad" --output "$work/bad.h5" 2>&1)
status=$?
set -e
[ "$status" -eq 1 ] || { echo "$output"; echo "expected exit 1, got $status"; exit 1; }
grep -q "class_1/img_2.jpg': corrupt or truncated JPEG" <<<"$output" || { echo "$output"; exit 1; }
if ls "$work"/bad.h5* >/dev/null 2>&1; then echo "a partial output was left behind"; exit 1; fi
# Generated JPEG data, as benchmarks use it.
"$bin/myriad-data" synthetic --output "$work/synthetic.h5" --size 50 --num-classes 7 --input-shape 3x16x16 \
  --jpeg-quality 90 2>/dev/null
report=$("$bin/myriad-data" inspect "$work/synthetic.h5" 2>/dev/null)
grep -q "encoded: 50 JPEG, 0 PNG" <<<"$report"
grep -q "^classes    7 (num_classes)" <<<"$report"
"$bin/myriad-bench" loader --data "$work/synthetic.h5" --workers 2 --batch-size 10 --steps 3 | grep -q "images/s"
echo "data tools e2e: OK"
