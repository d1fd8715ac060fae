#!/usr/bin/env bash
# myriad-ckpt end to end: inspect, merge-classifier (rows match the shards), reshard (a run on the
# new world size resumes from it exactly as from the original), export-backbone (a torch.load
# archive; loaded with Python's torch when it is installed), and the checkpoint benchmark.
#   tests/e2e/ckpt_tools.sh BIN_DIR
source "$(dirname "$0")/common.sh"
train() { small_train "$1" --max-steps 12 --log-every 1 --lr 0.02 --sync-bn "${@:2}"; }
set +e
train 2 --batch-size 12 --run-dir "$work/a" --stop-at-step 6 >/dev/null 2>&1
set -e
ckpt="$work/a/checkpoints/step-000000006"
"$bin/myriad-ckpt" inspect "$work/a/checkpoints" | tee "$work/inspect.txt"
grep -q "classifier  37 classes x 32, 2 shards" "$work/inspect.txt"
[ "$(grep -c ' ok$' "$work/inspect.txt")" -eq 3 ]

"$bin/myriad-ckpt" merge-classifier "$ckpt" --output "$work/classifier.h5"
[ "$("$bin/h5check" shape "$work/classifier.h5" /weight)" = 37x32 ]
# Rows 0..18 of the merged weight are shard 0's, rows 19..36 shard 1's.
"$bin/h5check" equal "$work/classifier.h5" "$ckpt/classifier-00000.h5" /weight --rows-a 0:19 --rows-b 0:19
"$bin/h5check" equal "$work/classifier.h5" "$ckpt/classifier-00001.h5" /weight --rows-a 19:18 --rows-b 0:18
if "$bin/h5check" equal "$work/classifier.h5" "$ckpt/classifier-00001.h5" /weight --rows-a 18:18 --rows-b 0:18 \
  >/dev/null; then
  echo "rows shifted by one compare equal: the comparison cannot fail"; exit 1
fi

"$bin/myriad-ckpt" reshard "$ckpt" --world-size 3 --output "$work/three"
"$bin/myriad-ckpt" inspect "$work/three" | grep -q "3 shards"
cp -r "$work/a" "$work/b"
train 3 --batch-size 8 --run-dir "$work/a" --resume "$ckpt"
train 3 --batch-size 8 --run-dir "$work/b" --resume "$work/three"
diff <(losses "$work/a" | tail -n 6) <(losses "$work/b" | tail -n 6)
echo "reshard: resuming from the resharded checkpoint matches resuming from the original"

"$bin/myriad-ckpt" export-backbone "$work/a/checkpoints" --output "$work/backbone.pt"
if python3 -c "import torch" 2>/dev/null; then
  python3 - "$work/backbone.pt" <<'PY'
import sys, torch
state = torch.load(sys.argv[1])
assert "features.0.weight" in state and state["features.0.weight"].shape == (32, 1, 3, 3), list(state)[:5]
print(f"torch.load: {len(state)} tensors")
PY
else
  [ "$(head -c 2 "$work/backbone.pt")" = PK ] && grep -aq "data.pkl" "$work/backbone.pt" && echo "export: a torch archive (Python torch not installed here)"
fi
mkdir "$work/bench"
"$bin/myriad-bench" checkpoint --dir "$work/bench" --num-classes 10K --embedding-size 32 --backbone smallcnn \
  --input-shape 1x16x16 --log-level warn | tee "$work/bench.txt"
grep -q "^save: .* GB/s" "$work/bench.txt" && grep -q "^load: .* GB/s" "$work/bench.txt"
[ -z "$(ls "$work/bench")" ] || { echo "the checkpoint benchmark left files behind"; exit 1; }

set +e
output=$("$bin/myriad-ckpt" inspect "$work/nowhere" 2>&1)
code=$?
set -e
[ "$code" -eq 1 ] && grep -q "neither a checkpoint nor a directory of checkpoints" <<<"$output"
echo "ckpt tools e2e: OK"
