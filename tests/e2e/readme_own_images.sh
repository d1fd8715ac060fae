#!/usr/bin/env bash
# README.md's "Your own face images", end to end: the commands between its own-images markers,
# read from README.md itself (no copy of them here, so the two cannot drift apart), run in a
# scratch directory where build/bin and launch/ are this build's and this repository's, on small
# folders faces/ and faces-test/ of JPEG and PNG faces of three sizes. Each step's result is
# checked: every --output exists, the datasets hold every image at 112x112, the run directory has a
# checkpoint, myriad-embed logged the accuracy line, the ONNX file passes python3-onnx's checker.
#   tests/e2e/readme_own_images.sh BIN_DIR MAKE_IMAGE_TREE
source "$(dirname "$0")/common.sh"
make_image_tree=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAILED: $*"; exit 1; }

# The block: the lines between the markers, without a fence or the 4-space indentation.
commands=$(sed -n '/<!-- own-images:begin -->/,/<!-- own-images:end -->/p' "$repo/README.md" |
  sed -e '1d' -e '$d' -e '/^```/d' -e 's/^    //')
[ -n "$commands" ] || fail "README.md has no own-images block"
echo "$commands"
option() { grep -oE -- "--$1 [^ ]+" <<<"$commands" | head -n 1 | cut -d' ' -f2; }

# Enough images for one global batch on every rank launch/mpirun.sh starts (one per GPU).
gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
batch=$(option batch-size)
per_person=$(((${batch:-32} * (gpus > 0 ? gpus : 1) + 5) / 6 + 1))
cd "$work"
mkdir build
ln -s "$bin" build/bin
ln -s "$repo/launch" launch
"$make_image_tree" faces 6 "$per_person" faces 0
"$make_image_tree" faces-test 4 4 faces 100
# As root, mpirun needs consent (a user's own account does not).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash -euo pipefail -c "$commands" 2>&1 | tee readme.log

for output in $(grep -oE -- "--output [^ ]+" <<<"$commands" | cut -d' ' -f2); do
  [ -s "$output" ] || fail "the README's output '$output' was not written"
done
report=$(build/bin/myriad-data inspect faces.h5 2>/dev/null)
grep -q "^images     $((6 * per_person))$" <<<"$report" || fail "faces.h5: $report"
grep -q "^shape      112x112x3" <<<"$report" || fail "faces.h5: $report"
grep -q "^classes    6 (num_classes), 6 with images" <<<"$report" || fail "faces.h5: $report"
run_dir=$(option run-dir)
[ -s "$run_dir/checkpoints/LATEST" ] || fail "no checkpoint in $run_dir"
pairs=$(option pairs)
grep -qE "verification: $pairs pairs, accuracy [0-9.]+% ± [0-9.]+ \(10-fold, threshold -?[0-9.]+\)" readme.log ||
  fail "myriad-embed logged no accuracy line"
onnx=$(grep -oE -- "--output [^ ]+\.onnx" <<<"$commands" | cut -d' ' -f2)
if /usr/bin/python3 -c "import onnx" 2>/dev/null; then
  /usr/bin/python3 -c "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)" "$onnx"
  echo "$onnx: python3-onnx's checker accepts it"
else
  echo "$onnx: written (python3-onnx is not installed to check it)"
fi
echo "README own images e2e: OK"
