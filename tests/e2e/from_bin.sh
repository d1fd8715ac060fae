#!/usr/bin/env bash
# myriad-data from-bin end to end on verification sets written by Python's own pickle (protocols
# 2, 4 and 5, as insightface's scripts write lfw.bin and friends): the pairs file holds the image
# bytes unchanged and the flags, and myriad-train --eval-pairs reports its 10-fold accuracy; a
# pickle that would run code, or a truncated one, is an error naming the file, with no output left.
#   tests/e2e/from_bin.sh BIN_DIR MAKE_IMAGE_TREE
source "$(dirname "$0")/common.sh"
make_tree=$2
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 writes the reference pickles"; exit 77; }

# 40 images (20 pairs), their bytes in sorted path order, as tree.expected.h5 holds them.
"$make_tree" "$work/tree" 4 10
python3 - "$work" <<'PY'
import os, pickle, sys
work = sys.argv[1]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(f"{work}/tree") for f in fs if f.endswith((".jpg", ".png")))
bins = [open(f, "rb").read() for f in files]
issame = [i % 3 == 0 for i in range(len(bins) // 2)]
for protocol in (2, 4, 5):
    with open(f"{work}/set-p{protocol}.bin", "wb") as out:
        pickle.dump((bins, issame), out, protocol=protocol)
with open(f"{work}/issame.txt", "w") as out:
    out.write("".join("1" if s else "0" for s in issame) + "\n")

class Sneaky:
    pass
with open(f"{work}/code.bin", "wb") as out:
    pickle.dump((bins, Sneaky()), out, protocol=4)
PY

for protocol in 2 4 5; do
  "$bin/myriad-data" from-bin --input "$work/set-p$protocol.bin" --output "$work/set-p$protocol.h5" 2>/dev/null
  "$bin/h5check" equal "$work/set-p$protocol.h5" "$work/tree.expected.h5" /images
  [ "$("$bin/h5check" values "$work/set-p$protocol.h5" /issame | tr -d ' ')" = "$(cat "$work/issame.txt")" ] \
    || { echo "protocol $protocol: issame differs"; exit 1; }
done
report=$("$bin/myriad-data" inspect "$work/set-p4.h5" 2>/dev/null)
echo "$report"
grep -q "^pairs      20 (7 same identity)" <<<"$report"
echo "from-bin: protocols 2, 4, 5 give the same bytes and flags"

mpirun --oversubscribe -np 2 "$bin/myriad-train" --data "$work/tree.expected.h5" --eval-pairs "$work/set-p4.h5" \
  --input-shape 3x16x12 --backbone smallcnn --embedding-size 8 --batch-size 4 --max-steps 2 --workers 1 \
  --threads 1 --run-dir "$work/run" --log-level warn
grep -q '"verification":{"set-p4":{"accuracy":' "$work/run/metrics.jsonl" \
  || { cat "$work/run/metrics.jsonl"; echo "no verification accuracy in metrics.jsonl"; exit 1; }
echo "--eval-pairs: 10-fold accuracy of the converted set in metrics.jsonl"

expect_failure() {
  local pattern=$1 input=$2
  set +e
  local output
  output=$("$bin/myriad-data" from-bin --input "$input" --output "$work/bad.h5" 2>&1)
  local code=$?
  set -e
  [ "$code" -eq 1 ] && grep -q -- "$pattern" <<<"$output" || { echo "$output"; echo "expected exit 1 saying '$pattern'"; exit 1; }
  if ls "$work"/bad.h5* >/dev/null 2>&1; then echo "a partial output was left behind"; exit 1; fi
}
expect_failure "code.bin' imports __main__.Sneaky at byte .*runs no code" "$work/code.bin"
head -c 5000 "$work/set-p4.bin" >"$work/cut.bin"
expect_failure "cut.bin' is truncated" "$work/cut.bin"
expect_failure "cannot read '$work/none.bin'" "$work/none.bin"
echo "code, truncation, missing file: named, no output left"
echo "from-bin e2e: OK"
