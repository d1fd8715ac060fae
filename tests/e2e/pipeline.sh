#!/usr/bin/env bash
# Pipeline stages end to end (docs/pipeline.md), on the CPU in float32, 4 micro-batches per step:
#  * equivalence: an IResNet (batch norm) and a ViT (masking, drop path) cut into P = 2 and P = 3
#    stages give the losses of the first 3 steps, and the parameters after them, of P = 1 on the
#    same global batch within 1e-5 (relative): 2 ranks with P = 2 and 3 ranks with P = 3 against 1
#    rank, on the GPipe and the 1F1B schedule, and with P = 2 on the interleaved one (2 chunks a
#    stage, the last sending back to the first), 1F1B with P = 1 against GPipe, and 4 ranks with
#    P = 2 against 2 ranks with P = 1;
#  * the timeline (--timeline) of r18's runs: each stage's passes in its schedule's order, and after
#    its neighbours' across the ranks' timelines; interleaved, each pass names its chunk;
#  * evaluation through 2 stages, and through their 4 interleaved chunks, as one rank evaluates;
#  * resume across P and W: a run stopped with P = 2 resumes with P = 1 (2 -> 1 stage, 4 -> 2
#    ranks), one stopped with P = 1 resumes with P = 2 (1 -> 2 stages), and one with a hand cut
#    resumes with the profiled one, one on 1F1B resumes on GPipe, and one interleaved (its chunks
#    gathered for the checkpoint) on 1F1B; the resumed losses match an uninterrupted run with the
#    resumed layout within 1e-5.
#   tests/e2e/pipeline.sh BIN_DIR
source "$(dirname "$0")/common.sh"
py=$(python_with h5py numpy)

# A gentle margin and rate (as tests/e2e/train_equivalence.sh): float32 noise between layouts (sums
# over other classifier shards) must not grow past the tolerance within the steps compared. Micro-
# batches of 8: batch norm over 2 samples (the 1x1 maps of the last stage, the embedding) turns
# every value into +-1 and amplifies that noise by 1 / sigma, which soon exceeds any tolerance.
train() { # RANKS NET SHAPE RUN_DIR [options]
  local ranks=$1 net=$2 shape=$3 run=$4
  shift 4
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin/myriad-train" --data synthetic --input-shape "$shape" \
    --backbone "$net" --embedding-size 32 --num-classes 40 --batch-size 32 --micro-batches 4 --max-steps "${steps:-3}" \
    --log-every 1 --workers 1 --threads 1 --device cpu --log-level warn --lr 0.001 --margin arcface --scale 16 \
    --m2 0.3 --run-dir "$run" "$@"
}
# Losses of A and B within TOLERANCE (relative), step by step (B's last N when N is given).
same_losses() { # RUN_A RUN_B WHAT TOLERANCE [N]
  paste <(losses "$1" | tail -n "${5:-1000}") <(losses "$2" | tail -n "${5:-1000}") | awk -v what="$3" -v tol="$4" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
    END { if (n == 0 || worst > tol) { printf "%s: losses differ by %.3g (relative, %d steps)\n", what, worst, n; exit 1 }
          printf "%s: %d losses within %.2g\n", what, n, worst }'
}
# Every parameter of two checkpoints within 1e-5 relative: |a - b| <= 1e-5 |a| (2-norms), plus
# 1e-6 per element for tensors whose true value is 0 (biases of batch norms followed by another),
# which hold only rounding noise. Batch-norm running statistics (buffers, not parameters) get 1e-4:
# they average the batch statistics of every micro-batch, where float noise is largest (on the GPU
# nodes' CPUs, LibTorch 2.11, vit_t's feature running mean came to 1.3 times 1e-5); an update in
# the wrong place is off by 1e-2 or more.
same_parameters() { # CHECKPOINT_A CHECKPOINT_B WHAT
  "$py" - "$@" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(f"{p}/replicated.h5", "r")["backbone"] for p in sys.argv[1:3])
assert sorted(a) == sorted(b), "different tensors"
worst, where = 0.0, ""
for name in a:
    x, y = a[name][...].astype(np.float64), b[name][...].astype(np.float64)
    relative = 1e-4 if "running_" in name else 1e-5
    excess = np.linalg.norm(x - y) / (relative * np.linalg.norm(x) + 1e-6 * np.sqrt(x.size))
    if excess > worst:
        worst, where = excess, name
assert worst <= 1, f"{sys.argv[3]}: {where} differs by {worst:.3g} times the tolerance"
print(f"{sys.argv[3]}: {len(a)} tensors within {worst:.2g} of the tolerance ({where})")
PY
}

# The pipeline record of the last train record: its schedule, every stage busy and predicted, a bubble in [0, 1),
# and the activations of the cuts sent forward and their gradients back (float32, 4 bytes).
pipeline_record() { # RUN_DIR STAGES SCHEDULE
  "$py" - "$@" <<'PY'
import sys, json
records = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"train"' in l]
p, stages = records[-1]["pipeline"], int(sys.argv[2])
assert p["stages"] == stages and p["micro_batches"] == 4 and p["schedule"] == sys.argv[3], p
assert len(p["stage_busy_ms"]) == stages and min(p["stage_busy_ms"]) > 0, p
# One stage is not profiled, so nothing is predicted.
assert stages == 1 or (len(p["predicted_stage_ms"]) == stages and min(p["predicted_stage_ms"]) > 0), p
assert 0 <= p["bubble"] < 1 and abs(p["gpipe_bubble"] - (stages - 1) / (4 + stages - 1)) < 1e-12, p
assert (p["bytes_per_step"] > 0) == (stages > 1) and p["bytes_per_step"] % 4 == 0, p
PY
}

# The timeline of steps 2 and 3 (--timeline, docs/pipeline.md): every rank's forward and backward
# of each micro-batch once per step, in the order the schedule defines for its stage (derived here
# from the schedules' definitions), one after another on its stage; each forward on stage s + 1
# after stage s's, each backward on stage s after stage s + 1's, read across the ranks' timelines
# (lined up by a barrier; 50 ms for a rank that the scheduler of this oversubscribed machine runs
# late after the barrier, against a step of over a second); the classifier once per micro-batch
# (1F1B) or step (GPipe) on every rank. Interleaved, each pass names its chunk, and the checks are
# of each pass once a step and after the virtual stage it depends on.
timeline_check() { # RUN_DIR STAGES SCHEDULE
  "$py" - "$@" <<'PY'
import sys, json
run, P, schedule, M, tol = sys.argv[1], int(sys.argv[2]), sys.argv[3], 4, 50e3
t = json.load(open(f"{run}/timeline.json"))
assert t["otherData"] == {"first_step": 2, "steps": 2, "ranks": P}, t["otherData"]
names = {e["pid"]: e["args"]["name"] for e in t["traceEvents"] if e["name"] == "process_name"}
assert sorted(names) == list(range(P)) and all(f"stage {r} " in names[r] for r in range(P)), names
if schedule == "interleaved":
    # V = 2 chunks a stage: each pass names its chunk, runs once a step, and waits for the pass it
    # depends on (virtual stage c P + s follows c P + s - 1 forward, precedes it backward).
    V = 2
    for step in (2, 3):
        ev = [e for e in t["traceEvents"] if e["ph"] == "X" and e["args"]["step"] == step]
        span = {}
        for s in range(P):
            mine = sorted((e for e in ev if e["pid"] == s and e["tid"] == 0), key=lambda e: e["ts"])
            for a, b in zip(mine, mine[1:]):
                assert b["ts"] >= a["ts"] + a["dur"], f"step {step}, stage {s}: {a['name']} overlaps {b['name']}"
            for e in mine:
                kind = e["name"].split()[0]
                if kind not in ("forward", "backward"):
                    continue
                c, m = e["args"]["chunk"], e["args"]["micro_batch"]
                assert e["name"] == f"{kind} {m} (chunk {c})", e["name"]
                assert (kind, c * P + s, m) not in span, f"step {step}: {e['name']} twice on stage {s}"
                span[(kind, c * P + s, m)] = (e["ts"], e["ts"] + e["dur"])
        want = {(k, v, m) for k in ("forward", "backward") for v in range(V * P) for m in range(M)}
        assert set(span) == want, f"step {step}: passes {sorted(set(span) ^ want)} missing or extra"
        for v in range(V * P - 1):
            for m in range(M):
                assert span[("forward", v + 1, m)][0] >= span[("forward", v, m)][1] - tol, (step, v, m)
                assert span[("backward", v, m)][0] >= span[("backward", v + 1, m)][1] - tol, (step, v, m)
    print(f"timeline, P = {P}, interleaved: every chunk's passes once, named, after those they need")
    sys.exit(0)
def order(s):
    if schedule == "gpipe":
        return [("forward", m) for m in range(M)] + [("backward", m) for m in reversed(range(M))]
    w = min(P - s - 1, M)
    passes = [("forward", m) for m in range(w)]
    for i in range(M - w):
        passes += [("forward", w + i), ("backward", i)]
    return passes + [("backward", m) for m in range(M - w, M)]
for step in (2, 3):
    ev = [e for e in t["traceEvents"] if e["ph"] == "X" and e["args"]["step"] == step]
    span = {}
    for s in range(P):
        mine = sorted((e for e in ev if e["pid"] == s and e["tid"] == 0), key=lambda e: e["ts"])
        for a, b in zip(mine, mine[1:]):
            assert b["ts"] >= a["ts"] + a["dur"], f"step {step}, stage {s}: {a['name']} overlaps {b['name']}"
        passes = [(e["name"].split()[0], e["args"]["micro_batch"]) for e in mine
                  if e["name"].split()[0] in ("forward", "backward")]
        assert passes == order(s), f"step {step}, stage {s}: {passes}"
        for e in mine:
            span[(e["name"], s)] = (e["ts"], e["ts"] + e["dur"])
        parts = sorted(e["name"] for e in ev if e["pid"] == s and e["name"].startswith("classifier"))
        assert parts == ([f"classifier {m}" for m in range(M)] if schedule == "1f1b" else ["classifier"]), parts
    for s in range(P - 1):
        for m in range(M):
            f, b = f"forward {m}", f"backward {m}"
            assert span[(f, s + 1)][0] >= span[(f, s)][1] - tol, f"step {step}: {f} on stage {s + 1} before stage {s}'s"
            assert span[(b, s)][0] >= span[(b, s + 1)][1] - tol, f"step {step}: {b} on stage {s} before stage {s + 1}'s"
print(f"timeline, P = {P}, {schedule}: every rank's passes in order, and after their neighbours'")
PY
}

for case in "r18 3x32x32" "vit_t 3x18x18"; do
  read -r net shape <<<"$case"
  train 1 "$net" "$shape" "$work/$net-p1" --checkpoint-every 3
  for stages in 1 2 3; do
    for schedule in gpipe 1f1b interleaved; do
      [ "$stages-$schedule" != 1-gpipe ] || continue
      # Interleaved runs the 4 micro-batches in groups of one per stage: P = 2 here.
      [ "$schedule" != interleaved ] || [ "$stages" -eq 2 ] || continue
      run="$work/$net-p$stages-$schedule"
      what="$net, $stages ranks with P = $stages ($schedule) against 1 rank (gpipe)"
      timeline=()
      [ "$net" != r18 ] || timeline=(--profile-steps 2:3 --timeline "$run/timeline.json")
      train "$stages" "$net" "$shape" "$run" --checkpoint-every 3 --pipeline-stages "$stages" \
        --pipeline-schedule "$schedule" "${timeline[@]}"
      same_losses "$work/$net-p1" "$run" "$what" 1e-5
      pipeline_record "$run" "$stages" "$schedule"
      [ ${#timeline[@]} -eq 0 ] || timeline_check "$run" "$stages" "$schedule"
      same_parameters "$work/$net-p1/checkpoints/step-000000003" "$run/checkpoints/step-000000003" \
        "$what"
    done
  done
  train 2 "$net" "$shape" "$work/$net-w2" --checkpoint-every 3
  train 4 "$net" "$shape" "$work/$net-w4" --checkpoint-every 3 --pipeline-stages 2
  same_losses "$work/$net-w2" "$work/$net-w4" "$net, 4 ranks with P = 2 against 2 ranks" 1e-5
  same_parameters "$work/$net-w2/checkpoints/step-000000003" "$work/$net-w4/checkpoints/step-000000003" \
    "$net, 4 ranks with P = 2 against 2 ranks"
done

# Channels-last maps between stages (sent as their dense NHWC view), and evaluation through the
# stages: 2 stages against 1 rank, the losses and the evaluation's top-1 and kNN top-1.
"$bin/myriad-data" synthetic --output "$work/val.h5" --size 96 --num-classes 40 --input-shape 3x32x32 \
  --log-level warn >/dev/null
for ranks in 1 2; do
  train "$ranks" r18 3x32x32 "$work/eval-$ranks" --pipeline-stages "$ranks" --channels-last on \
    --val-data "$work/val.h5"
done
train 2 r18 3x32x32 "$work/eval-2i" --pipeline-stages 2 --pipeline-schedule interleaved \
  --channels-last on --val-data "$work/val.h5"
same_losses "$work/eval-1" "$work/eval-2" "r18 channels-last, 2 ranks with P = 2 against 1 rank" 1e-5
same_losses "$work/eval-1" "$work/eval-2i" \
  "r18 channels-last, 2 ranks with P = 2 interleaved against 1 rank" 1e-5
"$py" - "$work/eval-1" "$work/eval-2" "$work/eval-2i" <<'PY'
import sys, json
evals = [[json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"eval"' in l] for run in sys.argv[1:]]
assert all(len(e) == 1 for e in evals), evals
a = evals[0][0]
for b in (e[0] for e in evals[1:]):
    assert a["samples"] == b["samples"] == 96, (a, b)
    assert a["top1"] == b["top1"] and a["knn_top1"] == b["knn_top1"], (a, b)
    assert a["knn_queries"] == b["knn_queries"] > 0, (a, b)
print(f"evaluation through 2 stages and through their interleaved chunks: top-1 {a['top1']:.4f}, "
      f"kNN top-1 {a['knn_top1']:.4f}, as 1 rank")
PY

# Resume across P and W: stopped at step 2 of 5 with one layout, resumed with another, against
# runs of the resumed layout from the start.
resume() { # WHAT FROM_RANKS FROM_OPTIONS TO_RANKS TO_OPTIONS
  local what=$1 from_ranks=$2 from=$3 to_ranks=$4 to=$5 run="$work/resume-$RANDOM"
  set +e
  steps=5 train "$from_ranks" r18 3x32x32 "$run" --stop-at-step 2 $from >/dev/null 2>&1
  local code=$?
  set -e
  [ "$code" -eq 75 ] || { echo "$what: the first run exited $code"; exit 1; }
  steps=5 train "$to_ranks" r18 3x32x32 "$run" --resume auto $to
  steps=5 train "$to_ranks" r18 3x32x32 "$run-through" $to
  same_losses "$run-through" "$run" "resume $what" 1e-5 3
}
resume "2 -> 1 stage (2 -> 1 rank)" 2 "--pipeline-stages 2" 1 ""
resume "2 -> 1 stage (4 -> 2 ranks)" 4 "--pipeline-stages 2" 2 ""
resume "1 -> 2 stages (1 -> 2 ranks)" 1 "" 2 "--pipeline-stages 2"
resume "a hand cut -> the profiled one (2 -> 2 stages)" 2 "--pipeline-stages 2 --pipeline-split 3" 2 "--pipeline-stages 2"
resume "1f1b -> gpipe (2 -> 2 stages)" 2 "--pipeline-stages 2 --pipeline-schedule 1f1b" 2 "--pipeline-stages 2 --pipeline-schedule gpipe"
resume "interleaved -> 1f1b (2 -> 2 stages)" 2 "--pipeline-stages 2 --pipeline-schedule interleaved" 2 "--pipeline-stages 2 --pipeline-schedule 1f1b"
echo "pipeline e2e: OK"
