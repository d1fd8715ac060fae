#!/usr/bin/env bash
# launch/slurm/train.sbatch on a real 2-node Slurm over the namespace hosts of
# tests/support/netns_cluster.sh: munged and slurmctld on myrh1, one slurmd per host (its own
# NodeName, spool, TmpFS, pid file and log). `sbatch --nodes=2 --ntasks-per-node=1`, srun
# --mpi=pmix, one rank per host over TCP; SIGUSR1 to the batch shell mid-run (scancel -b, which
# train.sbatch passes on to the step), and the job must checkpoint on both hosts, requeue itself,
# resume on both hosts and finish with a continuous step count. Needs root, network namespaces
# and Debian's slurm-wlm and munge; skipped (77) without them.
#   tests/e2e/slurm_multi_host.sh BIN_DIR
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
for tool in munged slurmctld slurmd sbatch srun scontrol scancel sinfo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool is not installed"; exit 77; }
done
source "$repo/tests/support/netns_cluster.sh"
# Tears itself down on exit: every daemon, job step and rank below runs inside a host.
cluster_up 2

source "$repo/tests/support/slurm_hosts.sh"
slurm_hosts_up myriadmulti

# Each task records where it runs (its host's name and the node Slurm says it is on), then
# becomes myriad-train: an account of the hosts independent of myriad's own log.
mkdir -p "$work/tasks"
cat >"$work/train.sh" <<EOF
#!/bin/sh
echo "\$(hostname) \$SLURMD_NODENAME" >"$work/tasks/start\${SLURM_RESTART_COUNT:-0}-rank\$SLURM_PROCID"
exec "$bin/myriad-train" "\$@"
EOF
chmod +x "$work/train.sh"
export MYRIAD_TRAIN="$work/train.sh"

# Signalled at step 100 or so, long before the end even at 2-3 ms a step; a record every 10 steps.
steps=1200
job=$(on_login sbatch --parsable --chdir="$work" --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
  --gpus-per-task=0 --output="$work/job-%j.out" "$repo/launch/slurm/train.sbatch" \
  --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 \
  --batch-size 8 --max-steps "$steps" --log-every 10 --threads 1 --workers 1 --device cpu --run-dir "$work/run")
echo "submitted job $job"
# Empty while scontrol cannot answer (slurmctld busy): callers treat that as "not yet".
state() { on_login scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }

for _ in $(seq 1 600); do
  records=$(grep -c '"kind":"train"' "$work/run/metrics.jsonl" 2>/dev/null) || true
  [ "${records:-0}" -ge 10 ] && break
  # One reading per check: the job moves PENDING -> CONFIGURING -> RUNNING while we look.
  now=$(state)
  case "$now" in "" | PENDING | CONFIGURING | RUNNING) ;; *) fail "job is $now before it was signalled" ;; esac
  sleep 0.1
done
now=$(state)
[ "$now" = RUNNING ] || fail "job is not running when it should be signalled ($now)"
# To the batch shell only: train.sbatch passes the signal on to srun, which sends it to the ranks on
# both hosts (the path of `#SBATCH --signal=B:USR1@...`).
on_login scancel --batch --signal=USR1 "$job"
echo "sent SIGUSR1 at step $(tail -n 1 "$work/run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2)"

for _ in $(seq 1 300); do
  case "$(state)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 1
done
output="$work/job-$job.out"
now=$(state)
[ "$now" = COMPLETED ] || fail "job ended $now"
restarts=$(on_login scontrol show job "$job" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
[ "$restarts" -eq 1 ] || fail "job restarted $restarts times, expected 1"
for start in 1 2; do
  grep -q "job $job, start $start: 2 node(s) (myrh\[1-2\]), 2 task(s)" "$output" || fail "start $start did not get the 2 nodes"
done

# Both starts ran rank 0 on myrh1 and rank 1 on myrh2, each on the host Slurm placed it on, and
# myriad-train's start-up line says so.
[ "$(grep -c 'myriad-train: 2 ranks on 2 hosts: myrh1 rank 0 on cpu, myrh2 rank 1 on cpu;' "$output")" -eq 2 ] \
  || fail "the start-up lines do not place rank 0 on myrh1 and rank 1 on myrh2: $(grep 'ranks on' "$output")"
for start in 0 1; do
  for rank in 0 1; do
    where=$(cat "$work/tasks/start$start-rank$rank" 2>/dev/null) || fail "no task record of start $start, rank $rank"
    [ "$where" = "myrh$((rank + 1)) myrh$((rank + 1))" ] || fail "start $start: rank $rank ran on '$where' (host, Slurm node), expected myrh$((rank + 1))"
  done
done

grep -q "stopped with a checkpoint; requeueing job $job" "$output" || fail "no requeue in the job output"
stopped_at=$(sed -n 's/.*stopping after step \([0-9]*\).*/\1/p' "$output")
[ -n "$stopped_at" ] && [ "$stopped_at" -lt "$steps" ] || fail "the job did not stop mid-run"
# Each rank wrote its classifier shard from its own host.
checkpoint=$(printf '%s/run/checkpoints/step-%09d' "$work" "$stopped_at")
for rank in 00000 00001; do
  [ -s "$checkpoint/classifier-$rank.h5" ] || fail "the checkpoint of step $stopped_at has no shard of rank $rank"
done
grep -q "resumed from .*step-0*$stopped_at (step $stopped_at" "$output" || fail "the requeued job did not resume from step $stopped_at"

# Continuous: one record every 10 steps from 10 to the last, none missing or repeated.
grep '"kind":"train"' "$work/run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2 >"$work/steps"
seq 10 10 "$steps" | diff - "$work/steps" >/dev/null || fail "logged steps are not 10, 20, ..., $steps"

# Nothing of the job is left on either host (a slurmstepd may still be finishing as the job
# completes).
job_left() {
  local host
  for host in "${CLUSTER_HOSTS[@]}"; do cluster_ps "$host" | grep -E 'myriad-train|slurmstepd' || true; done
}
for _ in $(seq 1 30); do
  [ -z "$(job_left)" ] && break
  sleep 1
done
[ -z "$(job_left)" ] || fail "left running after the job: $(job_left)"
echo "job $job on myrh1 + myrh2: SIGUSR1 at step $stopped_at, checkpointed on both hosts, requeued, resumed, finished $steps steps"
echo "slurm multi-host e2e: OK"
