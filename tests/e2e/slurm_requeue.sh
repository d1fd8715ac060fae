#!/usr/bin/env bash
# launch/slurm/train.sbatch on a real one-node Slurm started here (munged, slurmctld, slurmd on
# localhost, private ports and state): 2 tasks through srun --mpi=pmix, SIGUSR1 mid-run, and the
# job must checkpoint, requeue itself, resume from that checkpoint, and finish with a continuous
# step count. Needs root and Debian's slurm-wlm and munge (scripts/setup.sh installs them);
# skipped (77) without them.
#   tests/e2e/slurm_requeue.sh BIN_DIR
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/support/slurm_conf.sh"
for tool in munged slurmctld slurmd sbatch scontrol scancel sinfo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool is not installed"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: a private slurmd needs root"; exit 77; }

slurm="$work/slurm"
mkdir -p "$slurm/state" "$slurm/spool"
daemons=()
trap 'for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done; sleep 1; rm -rf "$work"' EXIT
fail() {
  echo "FAILED: $*"
  for f in "$slurm"/*.log "$work"/job-*.out; do [ -f "$f" ] && { echo "== $f"; tail -n 40 "$f"; }; done
  exit 1
}

# munge with its own key and socket.
dd if=/dev/urandom of="$slurm/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$slurm/munge.key"
munged --force --key-file="$slurm/munge.key" --socket="$slurm/munge.sock" --pid-file="$slurm/munged.pid" \
  --log-file="$slurm/munged.log" --seed-file="$slurm/munged.seed" || fail "munged did not start"
daemons+=("$(cat "$slurm/munged.pid")")

# Ports of our own, so that a Slurm already on this machine is not disturbed.
port=$(( 20000 + $$ % 20000 ))
node=$(hostname -s)
# At least the job's 2 tasks (config_overrides lets the node claim them); `nproc --all` ignores
# the OMP_NUM_THREADS=1 the test environment sets.
cpus=$(nproc --all)
[ "$cpus" -ge 2 ] || cpus=2
export SLURM_CONF="$slurm/slurm.conf"
write_slurm_conf "$SLURM_CONF" myriadtest "$node(127.0.0.1)" \
  "NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" "$slurm" "$slurm" \
  "SlurmctldPort=$port" "SlurmdPort=$((port + 1))"
slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start"
for _ in $(seq 1 50); do [ -s "$slurm/slurmctld.pid" ] && break; sleep 0.2; done
daemons+=("$(cat "$slurm/slurmctld.pid")")
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 1 50); do [ -s "$slurm/slurmd.pid" ] && break; sleep 0.2; done
daemons+=("$(cat "$slurm/slurmd.pid")")
for _ in $(seq 1 60); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || fail "the Slurm node did not become idle"
echo "slurm: $(sinfo -h -o '%P %D %T %c')"

# Long enough (a few thousand steps) to be signalled mid-run; a record every 10 steps.
steps=3000
# The script finds build/bin/myriad-train of the repository it was submitted from; a build
# elsewhere is named through MYRIAD_TRAIN.
if [ "$bin" -ef "$repo/build/bin" ]; then unset MYRIAD_TRAIN; else export MYRIAD_TRAIN="$bin/myriad-train"; fi
job=$(cd "$repo" && sbatch --parsable --nodes=1 --ntasks=2 --cpus-per-task=1 \
  --gpus-per-task=0 --output="$work/job-%j.out" launch/slurm/train.sbatch \
  --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 \
  --batch-size 8 --max-steps "$steps" --log-every 10 --threads 1 --workers 1 --run-dir "$work/run")
echo "submitted job $job"
# Empty while scontrol cannot answer (slurmctld busy): callers treat that as "not yet".
state() { scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }

for _ in $(seq 1 600); do
  records=$(grep -c '"kind":"train"' "$work/run/metrics.jsonl" 2>/dev/null) || true
  [ "${records:-0}" -ge 20 ] && break
  # One reading per check: the job moves PENDING -> CONFIGURING -> RUNNING while we look.
  now=$(state)
  case "$now" in "" | PENDING | CONFIGURING | RUNNING) ;; *) fail "job is $now before it was signalled" ;; esac
  sleep 0.1
done
now=$(state)
[ "$now" = RUNNING ] || fail "job is not running when it should be signalled ($now)"
scancel --signal=USR1 "$job"
echo "sent SIGUSR1 at step $(tail -n 1 "$work/run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2)"

for _ in $(seq 1 300); do
  case "$(state)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 1
done
output="$work/job-$job.out"
now=$(state)
[ "$now" = COMPLETED ] || fail "job ended $now"
restarts=$(scontrol show job "$job" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
[ "$restarts" -eq 1 ] || fail "job restarted $restarts times, expected 1"
grep -q "stopped with a checkpoint; requeueing job $job" "$output" || fail "no requeue in the job output"
stopped_at=$(sed -n 's/.*stopping after step \([0-9]*\).*/\1/p' "$output")
[ -n "$stopped_at" ] && [ "$stopped_at" -lt "$steps" ] || fail "the job did not stop mid-run"
grep -q "resumed from .*step-0*$stopped_at (step $stopped_at" "$output" || fail "the requeued job did not resume from step $stopped_at"

# Continuous: one record every 10 steps from 10 to the last, none missing or repeated.
grep '"kind":"train"' "$work/run/metrics.jsonl" | grep -o '"step":[0-9]*' | cut -d: -f2 >"$work/steps"
seq 10 10 "$steps" | diff - "$work/steps" >/dev/null || fail "logged steps are not 10, 20, ..., $steps"
echo "job $job: SIGUSR1 at step $stopped_at, checkpointed, requeued, resumed, finished $steps steps"
echo "slurm e2e: OK"
