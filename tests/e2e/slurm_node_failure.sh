#!/usr/bin/env bash
# launch/slurm/train.sbatch through a node failure, on a real 3-node Slurm over the namespace hosts
# of tests/support/netns_cluster.sh (set up as tests/e2e/slurm_multi_host.sh does: munged and
# slurmctld on myrh1, one slurmd per host). `sbatch --nodes=3 --ntasks-per-node=1` with
# MYRIAD_MAX_RESTARTS=1, MYRIAD_MIN_NODES=2 and a checkpoint every 20 steps; after the checkpoint of
# step 40 host 2 dies: its slurmd is SIGKILLed, then everything else in it (the step's slurmstepd
# and the rank). SlurmdTimeout=5 (default 300) has slurmctld declare it failed within about 30 s;
# srun ends on that notice, train.sbatch finds myrh2 DOWN (or NOT_RESPONDING, read a moment
# earlier), relaunches srun on myrh1 and myrh3 (--exclude myrh2) with --resume auto, and the job,
# kept by --no-kill, must complete with exit 0: one restart record dropping myrh2 alone, 3 -> 2
# ranks, the relaunch's tasks on myrh1 and myrh3, the steps after the record continuous, and their
# losses bit for bit those of a fresh 2-host --resume auto (launch/mpirun.sh) from a copy of the
# same checkpoint. Needs root, network namespaces and Debian's slurm-wlm and munge; skipped (77)
# without them.
#
# What Debian's Slurm (22.05.8) does not do:
#  - The step that ran on the failed node never completes while the job runs: slurmctld logs
#    "Removing failed node myrh2 from JobId=1" and "Killing JobId=1 StepId=0 due to failed node",
#    the job shrinks to myrh[1,3], but `scontrol show step` keeps StepId=1.0 RUNNING on myrh[1-3]
#    (myrh2's slurmstepd can never report its end; `scancel JOB.0` does not clear it either), and
#    it keeps its CPUs on myrh1 and myrh3. A relaunched srun without --overlap waits forever ("Job
#    1 step creation temporarily disabled, retrying (Requested nodes are busy)"), so train.sbatch
#    relaunches with --overlap; this test fails if it does not.
#  - A node whose slurmd dies while its slurmstepd lives is not this test: if only slurmd and the
#    rank are killed, myrh2's slurmstepd reports the rank's death, srun --kill-on-bad-exit ends the
#    step within KillWait (10 s), before slurmctld notices the silent slurmd (about 25 s here with
#    SlurmdTimeout=5); train.sbatch then finds myrh2 not yet down, relaunches on all 3 nodes, and that
#    launch fails on myrh2 ("Communication connection failure"). Killing everything in the host,
#    as a dead node does, makes srun wait for slurmctld's failure notice.
#   tests/e2e/slurm_node_failure.sh BIN_DIR
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool is not installed"; exit 77; }
done
source "$repo/tests/support/netns_cluster.sh"
# Tears itself down on exit: every daemon, job step and rank below runs inside a host.
cluster_up 3

source "$repo/tests/support/slurm_hosts.sh"
# SlurmdTimeout: a node whose slurmd does not answer slurmctld's pings (every SlurmdTimeout / 3 s)
# for 5 s is DOWN; the default is 300 s.
slurm_hosts_up myriadfail "SlurmdTimeout=5"

# Each task records where it runs, by step: an account of the hosts independent of myriad's log.
mkdir -p "$work/tasks"
cat >"$work/train.sh" <<EOF
#!/bin/sh
echo "\$(hostname) \$SLURMD_NODENAME" >"$work/tasks/step\$SLURM_STEP_ID-rank\$SLURM_PROCID"
exec "$bin/myriad-train" "\$@"
EOF
chmod +x "$work/train.sh"
export MYRIAD_TRAIN="$work/train.sh" MYRIAD_MAX_RESTARTS=1 MYRIAD_MIN_NODES=2
# Rank 0 (on myrh1, never killed) sleeps 30 ms a step (fault_slow_step), so that the job outlives
# the kill of myrh2 after step 40; the losses do not depend on it.
export MYRIAD_FAULT_SLOW_RANK=0:0.03

steps=400
options=(--data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37
  --workers 1 --threads 1 --device cpu --batch-size 8 --lr 0.02 --max-steps "$steps" --log-every 5)
job=$(on_login sbatch --parsable --chdir="$work" --nodes=3 --ntasks-per-node=1 --cpus-per-task=1 \
  --gpus-per-task=0 --output="$work/job-%j.out" "$repo/launch/slurm/train.sbatch" "${options[@]}" \
  --checkpoint-every 20 --checkpoint-keep 100 --hang-timeout 10 --run-dir "$work/run")
echo "submitted job $job"
output="$work/job-$job.out"
state() { on_login scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }
node_state() { on_login scontrol show node "$1" 2>/dev/null | sed -n 's/.*State=\([^ ]*\).*/\1/p' || true; }
last_step() { grep '"kind":"train"' "$work/run/metrics.jsonl" 2>/dev/null | tail -n 1 | grep -o '"step":[0-9]*' | cut -d: -f2 || true; }

# Until a checkpoint at step 40 or later is published and the ranks run on.
job_queued() { # or running; says the job's state otherwise
  local now
  now=$(state)
  case "$now" in "" | PENDING | CONFIGURING | RUNNING) ;; *) echo "job $job is $now" && return 1 ;; esac
}
wait_for_checkpoint "$work/run" 40 90 job_queued
latest=$(latest_step "$work/run")
[ "$(state)" = RUNNING ] || fail "job is not running when myrh2 should fail ($(state))"
cluster_ps myrh2 | grep -q myriad-train || fail "no rank runs on myrh2"

# Host 2 fails: its slurmd first (no more answers to slurmctld), then everything else on it, the
# step's slurmstepd and the rank, as when the node dies.
cluster_kill myrh2 KILL slurmd
cluster_kill myrh2 KILL
killed_at=$(date +%s)
echo "killed myrh2's slurmd, slurmstepd and rank at step $(last_step) (checkpoint $latest)"

for _ in $(seq 1 240); do
  case "$(state)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;; esac
  sleep 1
done
took=$(($(date +%s) - killed_at))
now=$(state)
echo "job $job: $now $took s after the failure; myrh2 is $(node_state myrh2)"
[ "$now" = COMPLETED ] || fail "job ended $now (or not within 240 s), not COMPLETED"
grep -q '^\[train.sbatch\] myriad-train exited with code 0$' "$output" || fail "train.sbatch did not end with code 0"
case "$(node_state myrh2)" in *DOWN*) ;; *) fail "Slurm does not report myrh2 DOWN: $(node_state myrh2)" ;; esac
for host in myrh1 myrh3; do
  case "$(node_state "$host")" in *DOWN* | *DRAIN* | *FAIL* | *NOT_RESPONDING*) fail "$host is $(node_state "$host")" ;; esac
done

# One restart record, for myrh2, 3 -> 2 ranks, from a checkpoint at or after the one of step 40.
restarts() { grep '"kind":"restart"' "$work/run/metrics.jsonl" || true; }
field() { grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2; }
[ "$(restarts | wc -l)" -eq 1 ] || fail "$(restarts | wc -l) restart records, not 1"
record=$(restarts)
resumed=$(field resumed_from_step <<<"$record")
[ "$(field attempt <<<"$record")" -eq 1 ] && [ "$(field world_size_before <<<"$record")" -eq 3 ] \
  && [ "$(field world_size_after <<<"$record")" -eq 2 ] || fail "the restart record is wrong: $record"
# srun ends on slurmctld's node-failure message, sent as it marks the node DOWN: train.sbatch reads
# the state a moment before or after, MIXED+NOT_RESPONDING or DOWN+NOT_RESPONDING.
grep -qE '"hosts_dropped":\[\{"host":"myrh2","why":"Slurm reports it [A-Z_+]*(DOWN|NOT_RESPONDING)[A-Z_+]*"\}\]' <<<"$record" \
  || fail "the record does not drop myrh2 as DOWN or NOT_RESPONDING (and only it): $record"
[ "$resumed" -ge 40 ] && [ $((resumed % 20)) -eq 0 ] || fail "resumed from step $resumed, not a checkpoint at or after 40"
grep -q "train.sbatch: restart 1 of 1 after exit code [0-9]*: myrh2 dropped, 3 -> 2 ranks, resuming from step $resumed" "$output" \
  && grep -q "resumed from .*(step $resumed" "$output" || fail "the restart lines are missing from the job's output"

# The relaunch ran rank 0 on myrh1 and rank 1 on myrh3 (step 1 of the job; step 0 was the first).
for rank in 0 1 2; do
  where=$(cat "$work/tasks/step0-rank$rank" 2>/dev/null) || fail "no task record of step 0, rank $rank"
  [ "$where" = "myrh$((rank + 1)) myrh$((rank + 1))" ] || fail "step 0: rank $rank ran on '$where'"
done
[ "$(cat "$work/tasks/step1-rank0" 2>/dev/null)" = "myrh1 myrh1" ] && [ "$(cat "$work/tasks/step1-rank1" 2>/dev/null)" = "myrh3 myrh3" ] \
  && [ ! -e "$work/tasks/step1-rank2" ] || fail "the relaunch did not run on myrh1 and myrh3 only: $(head "$work"/tasks/step1-* 2>&1)"
grep -q 'myriad-train: 2 ranks on 2 hosts: myrh1 rank 0 on cpu, myrh3 rank 1 on cpu;' "$output" \
  || fail "the relaunch's start-up line does not place its ranks on myrh1 and myrh3: $(grep 'ranks on' "$output")"

# Continuous after the restart record: resumed + 5, ..., steps.
records_after_restart() { awk '/"kind":"restart"/ { n = NR } { line[NR] = $0 } END { for (i = n + 1; i <= NR; i++) print line[i] }' "$work/run/metrics.jsonl"; }
records_after_restart | grep '"kind":"train"' | grep -o '"step":[0-9]*' | cut -d: -f2 >"$work/steps"
seq $((resumed + 5)) 5 "$steps" | diff - "$work/steps" >/dev/null \
  || fail "the steps after the restart are not $((resumed + 5)), ..., $steps: $(tr '\n' ' ' <"$work/steps")"

unset MYRIAD_FAULT_SLOW_RANK
# The reference: a fresh 2-host run (launch/mpirun.sh on myrh1 and myrh3) resumed from a copy of
# the same checkpoint.
checkpoint=step-$(printf %09d "$resumed")
mkdir -p "$work/fresh/checkpoints"
cp -a "$work/run/checkpoints/$checkpoint" "$work/fresh/checkpoints/"
echo "$checkpoint" >"$work/fresh/checkpoints/LATEST"
printf 'myrh1 slots=1\nmyrh3 slots=1\n' >"$work/hosts-1-3"
on_login "$repo/launch/mpirun.sh" --hostfile "$work/hosts-1-3" -n 2 --exe "$bin/myriad-train" -- "${options[@]}" \
  --log-level warn --run-dir "$work/fresh" --resume auto >"$work/fresh.log" 2>&1 \
  || { cat "$work/fresh.log"; fail "the fresh 2-host resume failed"; }
records_after_restart | grep -o '"loss":[-0-9.eE+]*' >"$work/after"
[ "$(wc -l <"$work/after")" -eq $(((steps - resumed) / 5)) ] \
  && cmp -s "$work/after" <(grep -o '"loss":[-0-9.eE+]*' "$work/fresh/metrics.jsonl") \
  || fail "the losses after the restart differ from a fresh 2-host --resume auto from step $resumed"

# Nothing of the job is left on the hosts that remain (a slurmstepd may still be finishing).
job_left() {
  local host
  for host in myrh1 myrh3; do cluster_ps "$host" | grep -E 'myriad-train|slurmstepd' || true; done
}
for _ in $(seq 1 30); do
  [ -z "$(job_left)" ] && break
  sleep 1
done
[ -z "$(job_left)" ] || fail "left running after the job: $(job_left)"
echo "job $job: myrh2 failed after checkpoint $latest, DOWN in Slurm, relaunched on myrh1 + myrh3 from step $resumed, $((steps - resumed)) steps continuous and identical to a fresh resume, COMPLETED $took s after the failure"
echo "slurm node failure e2e: OK"
