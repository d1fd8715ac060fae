#!/usr/bin/env bash
# Sharded checkpoints end to end:
#  - 2 ranks stopped at step 10 and resumed to 20 log exactly the losses of an uninterrupted run,
#    with float32 or bfloat16 classifier weights;
#  - resuming on another world size (2 -> 3, 4 -> 2, same global batch) stays within float32
#    noise of the uninterrupted run;
#  - a corrupt, truncated or missing shard is an error naming the file; --resume auto falls back
#    to the previous valid checkpoint and says so;
#  - a job killed while saving leaves the previous checkpoint in use; a save that fails on one rank
#    is an error on every rank and publishes nothing.
#   tests/e2e/checkpoint_resume.sh BIN_DIR
source "$(dirname "$0")/common.sh"
train() { small_train "$1" --max-steps 20 --log-every 1 --lr 0.02 "${@:2}"; }
stopped() { # a run that exits with code 75 after checkpointing
  set +e
  train "$@" >/dev/null 2>&1
  local code=$?
  set -e
  [ "$code" -eq 75 ] || { echo "expected exit 75 after --stop-at-step, got $code"; exit 1; }
}

# Bit-exact on the same world size (Partial FC and momentum included).
train 2 --batch-size 8 --sample-rate 0.5 --run-dir "$work/full"
stopped 2 --batch-size 8 --sample-rate 0.5 --run-dir "$work/part" --stop-at-step 10
train 2 --batch-size 8 --sample-rate 0.5 --run-dir "$work/part" --resume auto
diff <(losses "$work/full") <(losses "$work/part") >/dev/null || { paste <(losses "$work/full") <(losses "$work/part"); echo "resumed losses differ"; exit 1; }
echo "same world size: 20 losses identical"

# bfloat16 weights (stochastically rounded): files hold them widened to float32, a resume narrows
# them back exactly and draws the same rounding bits, so the losses are identical again; and the
# weights really are bfloat16 (other losses than float32 weights).
train 2 --batch-size 8 --classifier-weight-dtype bf16 --run-dir "$work/full-bf16"
stopped 2 --batch-size 8 --classifier-weight-dtype bf16 --run-dir "$work/part-bf16" --stop-at-step 10
train 2 --batch-size 8 --classifier-weight-dtype bf16 --run-dir "$work/part-bf16" --resume auto
diff <(losses "$work/full-bf16") <(losses "$work/part-bf16") >/dev/null || { paste <(losses "$work/full-bf16") <(losses "$work/part-bf16"); echo "resumed bf16-weight losses differ"; exit 1; }
train 2 --batch-size 8 --run-dir "$work/full-fp32"
if diff <(losses "$work/full-fp32") <(losses "$work/full-bf16") >/dev/null; then echo "bf16 weights gave float32's losses"; exit 1; fi
echo "bf16 weights: 20 losses identical after a resume, and unlike float32 weights'"

# Other world sizes, global batch 24: SyncBN makes the split irrelevant. Each resumed run is
# compared with an uninterrupted run on the world size it started on, so the first 10 steps must
# match exactly and only the resumed steps carry reduction-order noise.
compare() {
  paste <(losses "$1") <(losses "$2") | awk -v what="$3" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
    END { if (NR != 20) { print what ": " NR " losses"; exit 1 }
          printf "%s: largest relative difference %.2g over 20 steps\n", what, worst; exit !(worst < 1e-4) }'
}
train 2 --batch-size 12 --sync-bn --run-dir "$work/ref"
stopped 2 --batch-size 12 --sync-bn --run-dir "$work/two-three" --stop-at-step 10
train 3 --batch-size 8 --sync-bn --run-dir "$work/two-three" --resume auto
compare "$work/ref" "$work/two-three" "2 -> 3 ranks"
train 4 --batch-size 6 --sync-bn --run-dir "$work/ref4"
stopped 4 --batch-size 6 --sync-bn --run-dir "$work/four-two" --stop-at-step 10
train 2 --batch-size 12 --sync-bn --run-dir "$work/four-two" --resume auto
compare "$work/ref4" "$work/four-two" "4 -> 2 ranks"

# Broken checkpoints: two checkpoints, then damage the newer.
stopped 2 --batch-size 8 --run-dir "$work/broken" --checkpoint-every 5 --stop-at-step 10
ckpts="$work/broken/checkpoints"
[ -d "$ckpts/step-000000005" ] && [ -d "$ckpts/step-000000010" ]
expect_error() {
  local pattern=$1
  shift
  set +e
  output=$(train 2 --batch-size 8 --run-dir "$work/broken" "$@" 2>&1)
  local code=$?
  set -e
  [ "$code" -ne 0 ] || { echo "$output"; echo "expected a failure"; exit 1; }
  grep -q -- "$pattern" <<<"$output" || { echo "$output"; echo "error does not say '$pattern'"; exit 1; }
}
cp "$ckpts/step-000000010/classifier-00001.h5" "$work/saved.h5"
printf 'garbage' | dd of="$ckpts/step-000000010/classifier-00001.h5" bs=1 seek=4096 conv=notrunc 2>/dev/null
expect_error "classifier-00001.h5' is corrupt: checksum" --resume "$ckpts/step-000000010"
truncate -s 1000 "$ckpts/step-000000010/classifier-00001.h5"
expect_error "classifier-00001.h5' has 1000 bytes, its manifest says" --resume "$ckpts/step-000000010"
rm "$ckpts/step-000000010/classifier-00001.h5"
expect_error "classifier-00001.h5' is missing" --resume "$ckpts/step-000000010"
# auto skips the broken newest checkpoint, says so, and resumes from step 5.
output=$(level=info train 2 --batch-size 8 --run-dir "$work/broken" --resume auto 2>&1)
grep -q "skipping checkpoint '.*step-000000010'" <<<"$output" || { echo "$output"; exit 1; }
grep -q "resumed from .*step-000000005 (step 5" <<<"$output" || { echo "$output"; exit 1; }
echo "broken checkpoints: named, and auto fell back to step 5"

# A job killed between writing its shards and publishing them.
stopped 2 --batch-size 8 --run-dir "$work/killed" --stop-at-step 5
set +e
MYRIAD_FAULT_KILL_AT=manifest train 2 --batch-size 8 --run-dir "$work/killed" --resume auto --stop-at-step 8 \
  >/dev/null 2>&1
set -e
ls -a "$work/killed/checkpoints" | grep -q "^.tmp-step-000000008$" || { ls -a "$work/killed/checkpoints"; exit 1; }
grep -q "step-000000005" "$work/killed/checkpoints/LATEST"
output=$(level=info train 2 --batch-size 8 --run-dir "$work/killed" --resume auto 2>&1)
grep -q "resumed from .*step-000000005" <<<"$output" || { echo "$output"; exit 1; }
grep -q "removing '.*tmp-step-000000008'" <<<"$output" || { echo "$output"; exit 1; }
echo "killed during save: the previous checkpoint was used"

# A save that fails on one rank (as on a full disk) fails on every rank and publishes nothing.
set +e
output=$(MYRIAD_FAULT_SAVE_RANK=1 train 2 --batch-size 8 --run-dir "$work/killed" --resume auto --checkpoint-every 3 2>&1)
code=$?
set -e
[ "$code" -eq 1 ] || { echo "$output"; echo "expected exit 1 after a failed save, got $code"; exit 1; }
grep -q "checkpoint at step 6 failed on rank 1: injected failure" <<<"$output" || { echo "$output"; exit 1; }
grep -q "step-000000005" "$work/killed/checkpoints/LATEST" && [ ! -d "$work/killed/checkpoints/step-000000006" ]
echo "failed save: reported, previous checkpoint kept"
echo "checkpoint e2e: OK"
