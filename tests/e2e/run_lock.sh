#!/usr/bin/env bash
# One job per run directory, and no job outliving its launcher (docs/training.md, "One job per run
# directory" and "Stopping and preemption"):
#  * a second job on a held run directory is refused at its start with one line naming the holder,
#    every rank exits non-zero, nothing in the directory changes, and the holder's losses equal a
#    solo run's;
#  * mpirun killed with SIGKILL takes its ranks with it; the lock its rank 0 left (same host, dead
#    pid) is taken over at once and --resume auto goes on; the holder refreshes its heartbeat;
#    myriad-ckpt and myriad-embed read a live run's checkpoints;
#  * a lock from another host: taken over once its heartbeat is older than 60 s, respected while
#    fresh; a requeued Slurm job takes its own earlier start's lock over at once; a holder whose
#    lock was taken over all the same stops;
#  * launch/mpirun.sh: SIGHUP checkpoints and exits 75, under nohup it is ignored; SIGKILL of the
#    wrapper makes the job checkpoint and stop within seconds, and a job that does not stop is
#    killed after --grace; nothing is left running;
#  * on a cluster of namespace hosts: a live holder on another host is respected; once that host
#    is lost, its lock is respected until its heartbeat is older than the bound, then taken over.
#   tests/e2e/run_lock.sh BIN_DIR
source "$(dirname "$0")/common.sh"
sleep=$(command -v sleep)
stubborn="^$sleep 613\.$$\$"  # the command line of ranks that never stop, unique to this test
trap 'pkill -KILL -f "$work|$stubborn" 2>/dev/null || true; rm -rf "$work"' EXIT
repo=$(cd "$(dirname "$0")/../.." && pwd)
launch="$repo/launch/mpirun.sh"
host=$(hostname)
export OMPI_MCA_rmaps_base_oversubscribe=1
args=(--batch-size 8 --log-every 1)

# Each rank's exit code goes to $CODES/RANK.
cat >"$work/rank-exit.sh" <<'EOF'
#!/usr/bin/env bash
"$@"
code=$?
echo "$code" >"$CODES/.${OMPI_COMM_WORLD_RANK:-0}" && mv "$CODES/.${OMPI_COMM_WORLD_RANK:-0}" "$CODES/${OMPI_COMM_WORLD_RANK:-0}"
exit "$code"
EOF
chmod +x "$work/rank-exit.sh"
export CODES="$work/codes"

snapshot() { (cd "$1" && find . -printf '%y %p %s %T@\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r md5sum); }
wait_for() { # FILE SECONDS WHAT
  for _ in $(seq 1 $(($2 * 10))); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  echo "$3: no $1 after $2 s"
  exit 1
}
gone_within() { # PATTERN SECONDS WHAT: no process whose command line holds PATTERN is left
  for _ in $(seq 1 $(($2 * 10))); do
    pgrep -f "$1" >/dev/null || return 0
    sleep 0.1
  done
  pgrep -af "$1"
  echo "$3: processes left running $2 s later"
  exit 1
}
mtime() { stat -c %Y "$1"; }
# start RANKS LOG [options]: myriad-train under mpirun in the background; sets job (mpirun's pid).
start() {
  local ranks=$1 log=$2
  shift 2
  level=info small_train_command "$ranks" "$@" >"$log" 2>&1 &
  job=$!
}
small_train_command() { # as small_train, but mpirun is this process (exec), each rank through $wrap
  local ranks=$1
  shift
  exec mpirun --oversubscribe --bind-to none -np "$ranks" ${wrap:-} "$bin/myriad-train" --data synthetic \
    --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 --workers 1 --threads 1 \
    --device cpu --log-level "${level:-warn}" "$@"
}
# expect_refused LOG HOLDER_PATTERN WHAT [small_train arguments]: every rank exits non-zero with one
# error line naming the holder.
expect_refused() {
  local log=$1 holder=$2 what=$3 code=0
  shift 3
  rm -rf "$CODES" && mkdir -p "$CODES"
  (wrap="$work/rank-exit.sh" small_train_command 2 "${args[@]}" --max-steps 30 --checkpoint-every 10 --resume auto "$@") >"$log" 2>&1 || code=$?
  [ "$code" -ne 0 ] || { cat "$log"; echo "$what: a second job on a held run directory exited 0"; exit 1; }
  for rank in 0 1; do
    [ "$(cat "$CODES/$rank" 2>/dev/null)" = 1 ] || { cat "$log"; echo "$what: rank $rank exited '$(cat "$CODES/$rank" 2>/dev/null)', not 1"; exit 1; }
  done
  local errors
  errors=$(grep "error: " "$log" || true)
  [ "$(grep -c . <<<"$errors")" -eq 1 ] || { cat "$log"; echo "$what: expected one error line"; exit 1; }
  grep -qE "error: locking the run directory failed on rank 0: the (run|checkpoint) directory '.*' is in use by another job \($holder, since [0-9T:-]+Z; last heartbeat [0-9]+ s ago\)" <<<"$errors" \
    || { cat "$log"; echo "$what: the error line does not name the holder /$holder/"; exit 1; }
  ! grep -qE "terminate called|egmentation fault|core dumped" "$log" || { cat "$log"; echo "$what: a crash"; exit 1; }
  echo "$what: refused: $errors"
}

# --- two jobs on one run directory ------------------------------------------------------------------
small_train 2 "${args[@]}" --max-steps 30 --checkpoint-every 10 --run-dir "$work/solo" >/dev/null
run="$work/shared"
# Rank 0 sleeps 100 ms a step (fault_slow_step), so that the 30-step holder outlives its pause.
MYRIAD_FAULT_SLOW_RANK=0:0.1 start 2 "$run.log" "${args[@]}" --max-steps 30 --checkpoint-every 10 --run-dir "$run" \
  --checkpoint-dir "$run.checkpoints"
wait_for "$run.checkpoints/LOCK" 60 "the first job"
# The holder pauses, so that it is surely still running while the second job starts.
ranks=$(pgrep -P "$job" | tr '\n' ' ')
# shellcheck disable=SC2086
kill -STOP $ranks
holder_pid=$(grep -o '"pid":[0-9]*' "$run/LOCK" | cut -d: -f2)
grep -qw "$holder_pid" <<<"$ranks" || { echo "the lock names pid $holder_pid, not one of the ranks ($ranks)"; exit 1; }
before=$(snapshot "$run"; snapshot "$run.checkpoints")
expect_refused "$work/second.log" "host $host, pid $holder_pid" "a second job on a live run" --run-dir "$run"
after() { snapshot "$run"; snapshot "$run.checkpoints"; }
[ "$(after)" = "$before" ] || { diff <(echo "$before") <(after) || true; echo "the refused job changed the run's directories"; exit 1; }
# Also when only its --checkpoint-dir is the held one's.
expect_refused "$work/third.log" "host $host, pid $holder_pid" "another run directory, the same checkpoints" \
  --run-dir "$work/other" --checkpoint-dir "$run.checkpoints"
[ ! -e "$work/other" ] || { ls -la "$work/other"; echo "the refused job left its new run directory"; exit 1; }
[ "$(after)" = "$before" ] || { echo "the refused job changed the run's directories"; exit 1; }
# shellcheck disable=SC2086
kill -CONT $ranks
wait "$job" || { cat "$run.log"; echo "the holder failed"; exit 1; }
[ "$(losses "$run")" = "$(losses "$work/solo")" ] || { paste <(losses "$run") <(losses "$work/solo"); echo "the holder's losses differ from a solo run's"; exit 1; }
[ ! -e "$run/LOCK" ] && [ ! -e "$run.checkpoints/LOCK" ] || { echo "the lock outlived its job"; exit 1; }
echo "two jobs on one run directory: the second refused, the first's 30 losses equal a solo run's"

# --- mpirun killed with SIGKILL; the heartbeat --------------------------------------------------------
run="$work/killed"
start 2 "$run.log" "${args[@]}" --checkpoint-every 5 --max-steps 100000 --run-dir "$run"
wait_for "$run/checkpoints/LATEST" 60 "the job to kill"
# An old heartbeat is refreshed within 10 s.
touch -d '10 minutes ago' "$run/LOCK"
for _ in $(seq 1 150); do [ $(( $(date +%s) - $(mtime "$run/LOCK") )) -lt 60 ] && break; sleep 0.1; done
[ $(( $(date +%s) - $(mtime "$run/LOCK") )) -lt 60 ] || { echo "the holder did not refresh its heartbeat within 15 s"; exit 1; }
echo "heartbeat: an old one refreshed within 15 s"
# Reading a run in progress takes no lock.
"$bin/myriad-ckpt" inspect "$run/checkpoints" >"$work/inspect.log" 2>&1 || { cat "$work/inspect.log"; echo "myriad-ckpt could not read a live run"; exit 1; }
"$bin/myriad-data" synthetic --output "$work/faces.h5" --size 8 --num-classes 5 --input-shape 1x16x16 --log-level warn
mpirun --bind-to none -np 1 "$bin/myriad-embed" --checkpoint "$run/checkpoints" --data "$work/faces.h5" \
  --output "$work/faces-embedded.h5" --threads 1 --device cpu --log-level warn >"$work/embed.log" 2>&1 \
  || { cat "$work/embed.log"; echo "myriad-embed could not read a live run"; exit 1; }
echo "myriad-ckpt and myriad-embed read the checkpoints of the live run"
dead_pid=$(grep -o '"pid":[0-9]*' "$run/LOCK" | cut -d: -f2)
kill -KILL "$job"
gone_within "$run" 30 "mpirun killed with SIGKILL"
[ -e "$run/LOCK" ] || { echo "no lock left by the killed job (the test needs one)"; exit 1; }
began=$(date +%s)
step=$(latest_step "$run")
level=info small_train 2 "${args[@]}" --max-steps $((step + 5)) --resume auto --run-dir "$run" >"$run.resumed.log" 2>&1 \
  || { cat "$run.resumed.log"; echo "the killed job's directory did not resume"; exit 1; }
grep -q "took over the lock '$run/LOCK' of a job that is gone (host $host, pid $dead_pid, since .*): process $dead_pid no longer runs" "$run.resumed.log" \
  || { cat "$run.resumed.log"; echo "no takeover line"; exit 1; }
grep -q "resumed from .*(step $step" "$run.resumed.log" || { cat "$run.resumed.log"; echo "did not resume"; exit 1; }
echo "mpirun killed with SIGKILL: no rank left; its lock taken over at once, resumed ($(( $(date +%s) - began )) s)"

# --- locks of other hosts; Slurm requeues ----------------------------------------------------------
fake_lock() { # DIR HOST PID [JOB RESTART]
  mkdir -p "$1"
  printf '{"host":"%s","pid":%s,"pid_start":1,"boot_id":"x","pid_namespace":"x","slurm_job_id":"%s","slurm_restart_count":%s,"since":%s}\n' \
    "$2" "$3" "${4:-}" "${5:-0}" "$(date +%s)" >"$1/LOCK"
}
run="$work/elsewhere"
fake_lock "$run" node-elsewhere 4242
expect_refused "$work/fresh.log" "host node-elsewhere, pid 4242" "a fresh heartbeat from another host" --run-dir "$run"
touch -d '2 minutes ago' "$run/LOCK"
level=info small_train 1 --max-steps 2 --run-dir "$run" >"$run.log" 2>&1 || { cat "$run.log"; echo "a stale lock was not taken over"; exit 1; }
grep -qE "took over the lock '$run/LOCK' of a job that is gone \(host node-elsewhere, pid 4242, .*\): no heartbeat for 1[0-9]{2} s" "$run.log" \
  || { cat "$run.log"; echo "no takeover line for a stale heartbeat"; exit 1; }
[ ! -e "$run/LOCK" ] || { echo "the lock outlived its job"; exit 1; }
echo "another host's lock: respected with a fresh heartbeat, taken over after 2 minutes without one"

run="$work/requeued"
slurm_train() { # RESTART_COUNT LOG: a rank of Slurm job 777 at that restart
  mpirun --oversubscribe --bind-to none -np 1 env SLURM_JOB_ID=777 SLURM_RESTART_COUNT="$1" "$bin/myriad-train" \
    --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 --workers 1 \
    --threads 1 --device cpu --log-level info --max-steps 2 --run-dir "$run" >"$2" 2>&1
}
fake_lock "$run" node-elsewhere 4242 777 0
! slurm_train 0 "$run.same.log" || { cat "$run.same.log"; echo "the same start of a Slurm job took a live lock over"; exit 1; }
grep -q "in use by another job (host node-elsewhere, pid 4242, Slurm job 777 (start 1), since" "$run.same.log" \
  || { cat "$run.same.log"; echo "no refusal naming the Slurm job"; exit 1; }
slurm_train 1 "$run.log" || { cat "$run.log"; echo "a requeued Slurm job did not take its lock over"; exit 1; }
grep -q "took over the lock '$run/LOCK' of a job that is gone (host node-elsewhere, pid 4242, Slurm job 777 (start 1), since .*): Slurm restarted job 777 (start 2 now)" "$run.log" \
  || { cat "$run.log"; echo "no takeover line for a requeued Slurm job"; exit 1; }
echo "Slurm: a requeued job takes its earlier start's lock over at once; the same start does not"

# A holder whose lock another job took over all the same stops at its next heartbeat.
run="$work/usurped"
start 1 "$run.log" --max-steps 100000 --run-dir "$run"
wait_for "$run/metrics.jsonl" 60 "the job to usurp"
fake_lock "$run.new" node-elsewhere 4343
mv "$run.new/LOCK" "$run/LOCK"
timeout 20 tail --pid="$job" -f /dev/null || true
! kill -0 "$job" 2>/dev/null || { cat "$run.log"; echo "a holder whose lock was taken over still runs 20 s later"; exit 1; }
set +e
wait "$job"
code=$?
set -e
[ "$code" -ne 0 ] && grep -q "lost the lock '$run/LOCK' to another job (host node-elsewhere, pid 4343" "$run.log" \
  || { cat "$run.log"; echo "a holder whose lock was taken over went on (exit $code)"; exit 1; }
[ -e "$run/LOCK" ] && grep -q node-elsewhere "$run/LOCK" || { echo "the usurped holder removed the other's lock"; exit 1; }
echo "a holder whose lock was taken over: stopped at its next heartbeat (exit $code)"

# --- launch/mpirun.sh: SIGHUP, nohup, SIGKILL ---------------------------------------------------------
printf 'localhost slots=2\n' >"$work/hosts"
wrapped() { # RUN_DIR [launcher options]: prints the command line
  local run=$1
  shift
  echo "$launch" --hostfile "$work/hosts" --exe "$bin/myriad-train" --stop-file "$run.stop" "$@" -- \
    --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 --batch-size 8 \
    --max-steps 100000 --log-every 10 --workers 1 --threads 1 --log-level info --run-dir "$run"
}
ends_within() { # PID SECONDS WHAT: sets code
  timeout "$2" tail --pid="$1" -f /dev/null || true
  ! kill -0 "$1" 2>/dev/null || { echo "$3: still running $2 s later"; exit 1; }
  set +e
  wait "$1"
  code=$?
  set -e
}
expect_checkpoint() { # RUN_DIR WHAT
  [ -s "$1/checkpoints/LATEST" ] && grep -q "stopping after step $(latest_step "$1")" "$1.log" \
    || { cat "$1.log"; echo "$2: no checkpoint at the stop"; exit 1; }
  [ ! -e "$1/LOCK" ] && [ ! -e "$1.stop" ] || { echo "$2: the lock or the stop file outlived the job"; exit 1; }
}

run="$work/hup"
$(wrapped "$run") >"$run.log" 2>&1 &
wrapper=$!
wait_for "$run/metrics.jsonl" 60 "the job to hang up"
kill -HUP "$wrapper"
ends_within "$wrapper" 60 "SIGHUP to launch/mpirun.sh"
[ "$code" -eq 75 ] || { cat "$run.log"; echo "SIGHUP to launch/mpirun.sh: exit $code, not 75"; exit 1; }
expect_checkpoint "$run" "SIGHUP"
gone_within "$run" 10 "SIGHUP to launch/mpirun.sh"
echo "SIGHUP to launch/mpirun.sh: checkpoint, exit 75, nothing left"

run="$work/nohup"
# shellcheck disable=SC2046
nohup $(wrapped "$run") >"$run.log" 2>&1 &
wrapper=$!
wait_for "$run/metrics.jsonl" 60 "the job under nohup"
kill -HUP "$wrapper"
sleep 3
kill -0 "$wrapper" 2>/dev/null && [ ! -e "$run.stop" ] && ! grep -q "stopping after" "$run.log" \
  || { cat "$run.log"; echo "SIGHUP under nohup was not ignored"; exit 1; }
kill -TERM "$wrapper"
ends_within "$wrapper" 60 "SIGTERM under nohup"
[ "$code" -eq 75 ] || { cat "$run.log"; echo "SIGTERM under nohup: exit $code, not 75"; exit 1; }
gone_within "$run" 10 "nohup"
echo "nohup launch/mpirun.sh: SIGHUP ignored; SIGTERM then checkpoints, exit 75"

run="$work/orphan"
$(wrapped "$run") >"$run.log" 2>&1 &
wrapper=$!
wait_for "$run/metrics.jsonl" 60 "the job whose launcher is killed"
began=$(date +%s)
kill -KILL "$wrapper"
gone_within "$run" 60 "SIGKILL to launch/mpirun.sh"
elapsed=$(( $(date +%s) - began ))
grep -q "mpirun.sh: the launcher (pid $wrapper) is gone: asking the ranks to checkpoint and stop" "$run.log" \
  || { cat "$run.log"; echo "SIGKILL to launch/mpirun.sh: the watcher did not notice"; exit 1; }
expect_checkpoint "$run" "SIGKILL to launch/mpirun.sh"
[ "$elapsed" -le 10 ] || { cat "$run.log"; echo "SIGKILL to launch/mpirun.sh: the job took $elapsed s to stop"; exit 1; }
echo "SIGKILL to launch/mpirun.sh: checkpoint and stop within $elapsed s, nothing left"

# Ranks that never stop (sleep): killed after --grace, mpirun and all.
run="$work/stubborn"
MYRIAD_TRAIN=$sleep "$launch" --hostfile "$work/hosts" --stop-file "$run.stop" --grace 2 -- "613.$$" >"$run.log" 2>&1 &
wrapper=$!
for _ in $(seq 1 100); do [ "$(pgrep -c -f "$stubborn")" -eq 2 ] && break; sleep 0.1; done
[ "$(pgrep -c -f "$stubborn")" -eq 2 ] || { cat "$run.log"; echo "the sleep ranks did not start"; exit 1; }
kill -KILL "$wrapper"
gone_within "$stubborn" 20 "SIGKILL to launch/mpirun.sh with ranks that never stop"
gone_within "$run.stop" 5 "the watcher"
grep -q "did not stop within --grace 2 s: killing it" "$run.log" || { cat "$run.log"; echo "no --grace message"; exit 1; }
echo "SIGKILL to launch/mpirun.sh, ranks that never stop: killed after --grace, nothing left"

# --- hosts of a cluster ---------------------------------------------------------------------------
# Last: the cluster's Open MPI settings (TCP on eth0) hold only inside its hosts.
source "$repo/tests/support/netns_cluster.sh"
cluster_up 2
run="$work/cluster"
host_train() { # HOST LOG [options]: one rank on HOST
  local where=$1 log=$2
  shift 2
  cluster_exec "$where" mpirun --bind-to none -np 1 "$bin/myriad-train" --data synthetic --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --batch-size 8 --workers 1 --threads 1 --device cpu \
    --log-level info --run-dir "$run" "$@" >"$log" 2>&1
}
host_train myrh1 "$run.holder.log" --max-steps 100000 &
wait_for "$run/metrics.jsonl" 60 "the holder on myrh1"
holder_pid=$(grep -o '"pid":[0-9]*' "$run/LOCK" | cut -d: -f2)
grep -q '"host":"myrh1"' "$run/LOCK" || { cat "$run/LOCK"; echo "the lock does not name myrh1"; exit 1; }
! host_train myrh2 "$run.second.log" --max-steps 2 --resume auto || { cat "$run.second.log"; echo "myrh2 took over a live holder's lock"; exit 1; }
grep -qE "error: .*is in use by another job \(host myrh1, pid $holder_pid, since .*; last heartbeat [0-9] s ago\)" "$run.second.log" \
  || { cat "$run.second.log"; echo "myrh2's refusal does not name the holder on myrh1"; exit 1; }
echo "cluster: myrh2 refused while myrh1 holds the run"
# The holder's host is lost: its lock stays, with a recent heartbeat, until the bound.
cluster_kill myrh1 KILL
for _ in $(seq 1 100); do [ -z "$(cluster_pids myrh1)" ] && break; sleep 0.1; done
! host_train myrh2 "$run.early.log" --max-steps 2 --resume auto || { cat "$run.early.log"; echo "myrh2 took over before the heartbeat bound"; exit 1; }
grep -q "is in use by another job (host myrh1" "$run.early.log" || { cat "$run.early.log"; exit 1; }
touch -d '61 seconds ago' "$run/LOCK"
host_train myrh2 "$run.late.log" --max-steps 2 --resume auto || { cat "$run.late.log"; echo "myrh2 did not take over a stale lock"; exit 1; }
grep -q "took over the lock '$run/LOCK' of a job that is gone (host myrh1, pid $holder_pid, .*): no heartbeat for" "$run.late.log" \
  || { cat "$run.late.log"; echo "no takeover line on myrh2"; exit 1; }
echo "cluster: myrh1 lost; its lock respected until its heartbeat was 60 s old, then taken over by myrh2"
echo "run lock e2e: OK"
