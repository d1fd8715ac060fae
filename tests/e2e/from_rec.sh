#!/usr/bin/env bash
# myriad-data from-rec end to end on an insightface-style RecordIO dataset of real Fashion-MNIST
# JPEGs: the HDF5 holds the unchanged bytes and labels and trains; inspect counts images and
# classes; a corrupt or truncated record is an error naming it that leaves no output, unless
# --skip-bad skips and counts it; with --resize, images of two sizes make one dataset; a dataset
# without the insightface header works too.
#   tests/e2e/from_rec.sh BIN_DIR MAKE_RECORDIO
source "$(dirname "$0")/common.sh"
make_recordio=$2
set +e
"$make_recordio" "$work/fm" 2000
code=$?
set -e
[ "$code" -ne 77 ] || exit 77
[ "$code" -eq 0 ]

"$bin/myriad-data" from-rec --rec "$work/fm.rec" --idx "$work/fm.idx" --output "$work/fm.h5" --workers 2
"$bin/h5check" equal "$work/fm.h5" "$work/fm-expected.h5" /images
"$bin/h5check" equal "$work/fm.h5" "$work/fm-expected.h5" /labels
report=$("$bin/myriad-data" inspect "$work/fm.h5" 2>/dev/null)
echo "$report"
grep -q "^images     2000$" <<<"$report"
grep -q "^shape      28x28x3" <<<"$report"
grep -q "^classes    10 (num_classes), 10 with images" <<<"$report"
mpirun --oversubscribe -np 2 "$bin/myriad-train" --data "$work/fm.h5" --input-shape 3x28x28 --backbone smallcnn \
  --embedding-size 16 --batch-size 8 --max-steps 3 --workers 1 --threads 1 --run-dir "$work/run" --log-level warn
grep -q '"step":3' "$work/run/metrics.jsonl"
echo "from-rec: 2000 JPEGs and labels unchanged, 10 classes, trains"

expect_failure() { # pattern, then from-rec arguments; the output must not exist afterwards
  local pattern=$1
  shift
  set +e
  local output
  output=$("$bin/myriad-data" from-rec --output "$work/bad.h5" "$@" 2>&1)
  local code=$?
  set -e
  [ "$code" -eq 1 ] && grep -q -- "$pattern" <<<"$output" || { echo "$output"; echo "expected exit 1 saying '$pattern'"; exit 1; }
  if ls "$work"/bad.h5* >/dev/null 2>&1; then echo "a partial output was left behind"; exit 1; fi
}
# Record 700's magic word overwritten.
cp "$work/fm.rec" "$work/corrupt.rec"
offset=$(awk '$1 == 700 { print $2 }' "$work/fm.idx")
printf 'XXXX' | dd of="$work/corrupt.rec" bs=1 seek="$offset" conv=notrunc 2>/dev/null
expect_failure "record 700 of '$work/corrupt.rec' is corrupt: no RecordIO magic" --rec "$work/corrupt.rec" --idx "$work/fm.idx"
# A .rec cut inside its last image record (a dataset without identity records after the images),
# and one cut so short that its index points past the end.
"$make_recordio" "$work/plain" 300 no-header >/dev/null
cp "$work/plain.rec" "$work/cut.rec"
last=$(awk '$1 == 299 { print $2 }' "$work/plain.idx")
truncate -s $((last + 100)) "$work/cut.rec"
expect_failure "record 299 of '$work/cut.rec' is truncated" --rec "$work/cut.rec" --idx "$work/plain.idx"
truncate -s $((last - 100)) "$work/cut.rec"
expect_failure "record 299 starts at byte $last, past the end of '$work/cut.rec'" --rec "$work/cut.rec" \
  --idx "$work/plain.idx"
expect_failure "cannot open the index '$work/none.idx'" --rec "$work/fm.rec" --idx "$work/none.idx"
"$make_recordio" "$work/odd" 50 header odd-size >/dev/null
expect_failure "record 6 of '$work/odd.rec' holds a 14x14 image; the dataset's are 28x28" --rec "$work/odd.rec"
echo "corrupt, truncated, odd-sized, missing index: named, no output left"

# With --resize, images of any size make one dataset: the odd-sized record is resized too.
"$bin/myriad-data" from-rec --rec "$work/odd.rec" --output "$work/resized.h5" --resize 20x24 \
  --resize-mode stretch --encoding raw 2>/dev/null
report=$("$bin/myriad-data" inspect "$work/resized.h5" 2>/dev/null)
grep -q "^images     50$" <<<"$report" && grep -q "^shape      20x24x3" <<<"$report" &&
  grep -q "^encoding   raw" <<<"$report" || { echo "$report"; exit 1; }
echo "--resize: records of two sizes resized into one raw dataset"

output=$("$bin/myriad-data" from-rec --rec "$work/corrupt.rec" --idx "$work/fm.idx" --output "$work/skipped.h5" \
  --skip-bad 2>&1)
grep -q "skipping record 700 of" <<<"$output" && grep -q "1 bad records skipped" <<<"$output" || { echo "$output"; exit 1; }
grep -q "^images     1999$" <<<"$("$bin/myriad-data" inspect "$work/skipped.h5" 2>/dev/null)"
echo "--skip-bad: record 700 skipped and counted, 1999 images"

"$bin/myriad-data" from-rec --rec "$work/plain.rec" --output "$work/plain.h5" 2>/dev/null
"$bin/h5check" equal "$work/plain.h5" "$work/plain-expected.h5" /images
"$bin/h5check" equal "$work/plain.h5" "$work/plain-expected.h5" /labels
grep -q "^classes    10 (num_classes)" <<<"$("$bin/myriad-data" inspect "$work/plain.h5" 2>/dev/null)"
echo "no header: classes counted from the labels, index path derived from the .rec"
echo "from-rec e2e: OK"
