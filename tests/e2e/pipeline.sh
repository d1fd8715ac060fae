#!/usr/bin/env bash
# Pipeline stages end to end (docs/pipeline.md), on the CPU in float32, 4 micro-batches per step:
#  * equivalence: an IResNet (batch norm) and a ViT (masking, drop path) cut into P = 2 and P = 3
#    stages give the losses of the first 3 steps, and the parameters after them, of P = 1 on the
#    same global batch within 1e-5 (relative): 2 ranks with P = 2 and 3 ranks with P = 3 against 1
#    rank, and 4 ranks with P = 2 against 2 ranks with P = 1;
#  * resume across P and W: a run stopped with P = 2 resumes with P = 1 (2 -> 1 stage, 4 -> 2
#    ranks), one stopped with P = 1 resumes with P = 2 (1 -> 2 stages), and one with a hand cut
#    resumes with the profiled one; the resumed losses match an uninterrupted run with the resumed
#    P within 1e-5.
#   tests/e2e/pipeline.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with h5py numpy)

# A gentle margin and rate (as tests/e2e/train_equivalence.sh): float32 noise between layouts (sums
# over other classifier shards) must not grow past the tolerance within the steps compared.
train() { # RANKS NET SHAPE RUN_DIR [options]
  local ranks=$1 net=$2 shape=$3 run=$4
  shift 4
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-train" --data synthetic --input-shape "$shape" \
    --backbone "$net" --embedding-size 32 --num-classes 40 --batch-size 8 --micro-batches 4 --max-steps 3 \
    --log-every 1 --workers 1 --threads 1 --device cpu --log-level warn --lr 0.01 --margin arcface --scale 16 \
    --m2 0.3 --run-dir "$run" "$@"
}
# Losses of A and B within 1e-5 relative, step by step (B's last N when N is given).
same_losses() { # RUN_A RUN_B WHAT [N]
  paste <(losses "$1" | tail -n "${4:-1000}") <(losses "$2" | tail -n "${4:-1000}") | awk -v what="$3" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
    END { if (n == 0 || worst > 1e-5) { printf "%s: losses differ by %.3g (relative, %d steps)\n", what, worst, n; exit 1 }
          printf "%s: %d losses within %.2g\n", what, n, worst }'
}
# Every backbone tensor of two checkpoints within 1e-5 of the largest difference's scale.
same_parameters() { # CHECKPOINT_A CHECKPOINT_B WHAT
  "$py" - "$@" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(f"{p}/replicated.h5", "r")["backbone"] for p in sys.argv[1:3])
assert sorted(a) == sorted(b), "different tensors"
worst = 0.0
for name in a:
    x, y = a[name][...].astype(np.float64), b[name][...].astype(np.float64)
    scale = max(np.abs(x).max(), 1e-12)
    worst = max(worst, np.abs(x - y).max() / scale)
assert worst <= 1e-5, f"{sys.argv[3]}: parameters differ by {worst:.3g}"
print(f"{sys.argv[3]}: {len(a)} tensors within {worst:.2g}")
PY
}

for case in "r18 3x16x16" "vit_t 3x18x18"; do
  read -r net shape <<<"$case"
  train 1 "$net" "$shape" "$work/$net-p1" --checkpoint-every 3
  for stages in 2 3; do
    run="$work/$net-p$stages"
    train "$stages" "$net" "$shape" "$run" --checkpoint-every 3 --pipeline-stages "$stages"
    same_losses "$work/$net-p1" "$run" "$net, $stages ranks with P = $stages against 1 rank"
    same_parameters "$work/$net-p1/checkpoints/step-000000003" "$run/checkpoints/step-000000003" \
      "$net, $stages ranks with P = $stages against 1 rank"
  done
  train 2 "$net" "$shape" "$work/$net-w2" --checkpoint-every 3
  train 4 "$net" "$shape" "$work/$net-w4" --checkpoint-every 3 --pipeline-stages 2
  same_losses "$work/$net-w2" "$work/$net-w4" "$net, 4 ranks with P = 2 against 2 ranks"
  same_parameters "$work/$net-w2/checkpoints/step-000000003" "$work/$net-w4/checkpoints/step-000000003" \
    "$net, 4 ranks with P = 2 against 2 ranks"
done

# Resume across P and W: stopped at step 3 of 6 with one layout, resumed with another, against
# runs of the resumed layout from the start.
resume() { # WHAT FROM_RANKS FROM_OPTIONS TO_RANKS TO_OPTIONS
  local what=$1 from_ranks=$2 from=$3 to_ranks=$4 to=$5 run="$work/resume-$RANDOM"
  set +e
  train "$from_ranks" r18 3x16x16 "$run" --max-steps 6 --stop-at-step 3 $from >/dev/null 2>&1
  local code=$?
  set -e
  [ "$code" -eq 75 ] || { echo "$what: the first run exited $code"; exit 1; }
  train "$to_ranks" r18 3x16x16 "$run" --max-steps 6 --resume auto $to
  train "$to_ranks" r18 3x16x16 "$run-through" --max-steps 6 $to
  same_losses "$run-through" "$run" "resume $what" 3
}
resume "2 -> 1 stage (2 -> 1 rank)" 2 "--pipeline-stages 2" 1 ""
resume "2 -> 1 stage (4 -> 2 ranks)" 4 "--pipeline-stages 2" 2 ""
resume "1 -> 2 stages (1 -> 2 ranks)" 1 "" 2 "--pipeline-stages 2"
resume "a hand cut -> the profiled one (2 -> 2 stages)" 2 "--pipeline-stages 2 --pipeline-split 3" 2 "--pipeline-stages 2"
echo "pipeline e2e: OK"
