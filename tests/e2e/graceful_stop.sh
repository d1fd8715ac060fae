#!/usr/bin/env bash
# Stopping: SIGTERM and SIGUSR1 to the ranks (as Slurm delivers them to the tasks), SIGUSR1, SIGTERM
# and SIGINT to launch/mpirun.sh (with mpirun forwarding signals and with
# OMPI_MCA_ess_base_forward_signals=none, a stand-in for installations that forward nothing), and
# the stop file used directly all make every rank checkpoint at the next step boundary and exit
# with code 75, and a resumed run then trains to the end. A stop file older than the run is
# ignored; a second signal to the wrapper stops at once; a rank killed hard brings the whole job
# down within a bounded time instead of leaving the others waiting.
#   tests/e2e/graceful_stop.sh BIN_DIR
source "$(dirname "$0")/common.sh"
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
launch="$(cd "$(dirname "$0")/../.." && pwd)/launch/mpirun.sh"
printf 'localhost slots=2\n' >"$work/hosts"
train_args() { # RUN_DIR STEPS
  echo --data synthetic --input-shape 1x16x16 --backbone smallcnn --embedding-size 32 --num-classes 37 \
    --batch-size 8 --max-steps "$2" --log-every 10 --workers 1 --threads 1 --log-level info --run-dir "$1"
}
start() { # RUN_DIR [STEPS]: plain mpirun in the background of this shell, so that it can wait; sets pid
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-train" $(train_args "$1" "${2:-100000}") >"$1.log" 2>&1 &
  pid=$!
}
start_wrapped() { # RUN_DIR STEPS [myriad-train options]: through launch/mpirun.sh
  local run=$1 steps=$2
  shift 2
  # A shell ignores SIGINT in its background jobs; a terminal's Ctrl-C reaches a foreground one.
  OMPI_MCA_rmaps_base_oversubscribe=1 env --default-signal=INT "$launch" --hostfile "$work/hosts" --exe "$bin/myriad-train" \
    --stop-file "$run.stop" -- $(train_args "$run" "$steps") "$@" >"$run.log" 2>&1 &
  pid=$!
}
finish() { # waits at most $2 seconds for the job of $1 to end; sets code
  timeout "$2" tail --pid="$pid" -f /dev/null || true
  if kill -0 "$pid" 2>/dev/null; then
    cat "$1.log"
    for rank in $(pgrep -P "$pid"); do # which signals each rank blocks, ignores and catches
      echo "rank process $rank: $(grep -E '^Sig(Blk|Ign|Cgt)' "/proc/$rank/status" | xargs)"
    done
    echo "the job was still running $2 s later"; exit 1
  fi
  set +e
  wait "$pid"
  code=$?
  set -e
}
wait_for_steps() { # until metrics.jsonl has a record
  for _ in $(seq 1 300); do
    [ -s "$1/metrics.jsonl" ] && return 0
    sleep 0.1
  done
  echo "training did not start"; cat "$1.log"; exit 1
}

expect_stopped() { # RUN_DIR WHAT: exit 75 and a checkpoint mid-run; sets step
  [ "$code" -eq 75 ] || { cat "$1.log"; echo "$2: expected exit 75, got $code"; exit 1; }
  step=$(latest_step "$1")
  [ "${step:-0}" -gt 0 ] || { cat "$1.log"; echo "$2: no checkpoint"; exit 1; }
  "$bin/myriad-ckpt" inspect "$1/checkpoints" >/dev/null
  grep -q "stopping after step $step" "$1.log" || { cat "$1.log"; echo "$2: no stop message"; exit 1; }
}
# Resumes RUN_DIR through the wrapper and trains to step STEPS.
expect_resumes() { # RUN_DIR STEPS WHAT
  start_wrapped "$1" "$2" --resume auto
  # Up to 3000 steps: on a loaded 2-core machine they have taken 90 ms each.
  finish "$1" 400
  [ "$code" -eq 0 ] || { cat "$1.log"; echo "$3: the resumed run exited $code"; exit 1; }
  grep -q "resumed from .*(step $step" "$1.log" || { cat "$1.log"; echo "$3: did not resume from step $step"; exit 1; }
  grep -q "\"step\":$2," "$1/metrics.jsonl" || { echo "$3: the resumed run did not reach step $2"; exit 1; }
}

for how in term usr1; do
  run="$work/$how"
  start "$run"
  wait_for_steps "$run"
  pkill "-${how^^}" -P "$pid"
  # A repeated request must not cut the checkpoint short.
  pkill -TERM -P "$pid"
  finish "$run" 60
  expect_stopped "$run" "SIG${how^^} to the ranks"
  echo "SIG${how^^} to the ranks: checkpoint at step $step, exit 75"
done

# The wrapper: it runs mpirun in a session of its own and turns the signal into the stop file, so
# the result must not depend on whether this mpirun forwards signals. The ranks look at the stop
# file once a second; at 2-3 ms a step, 400 steps once ended before the request was seen.
steps=3000
for forward in default none; do
  for signal in USR1 TERM INT; do
    run="$work/wrapped-$signal-$forward"
    if [ "$forward" = none ]; then export OMPI_MCA_ess_base_forward_signals=none; fi
    start_wrapped "$run" "$steps"
    wait_for_steps "$run"
    kill "-$signal" "$pid"
    finish "$run" 60
    unset OMPI_MCA_ess_base_forward_signals
    expect_stopped "$run" "SIG$signal to launch/mpirun.sh (forwarding: $forward)"
    [ ! -e "$run.stop" ] || { echo "the stop file outlived the run"; exit 1; }
    expect_resumes "$run" "$steps" "SIG$signal to launch/mpirun.sh"
    echo "SIG$signal to launch/mpirun.sh (mpirun forwarding: $forward): checkpoint at step $step, exit 75, resumed to $steps"
  done
done

# The stop file by hand: the default RUN_DIR/STOP of a plain mpirun run, cleared once the ranks
# agreed; one older than the run is ignored (and removed).
run="$work/file"
mkdir -p "$run"
touch -d '1 hour ago' "$run/STOP"
start "$run" "$steps"
wait_for_steps "$run"
[ ! -e "$run/STOP" ] || { cat "$run.log"; echo "a stop file from before the run was not removed"; exit 1; }
touch "$run/STOP"
finish "$run" 60
expect_stopped "$run" "the stop file"
grep -q "removed the stop request '$run/STOP': it is from before this run" "$run.log"
[ ! -e "$run/STOP" ] || { echo "the stop file was not cleared"; exit 1; }
expect_resumes "$run" "$steps" "the stop file"
echo "stop file: an old one ignored and removed; a new one: checkpoint at step $step, exit 75, resumed to $steps"

# A second signal to the wrapper stops at once, with no process left behind. The ranks here are
# sleep(1), which never stops by itself, so that the second signal always comes first; for a
# duration nothing else on the machine sleeps (a shell's `sleep 600` once matched the search).
run="$work/twice"
MYRIAD_TRAIN=$(command -v sleep) OMPI_MCA_rmaps_base_oversubscribe=1 "$launch" --hostfile "$work/hosts" \
  --stop-file "$run.stop" -- 86321 >"$run.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ "$(pgrep -c -x sleep -P "$(pgrep -P "$pid" -x mpirun || echo 1)")" -eq 2 ] && break; sleep 0.1; done
kill -TERM "$pid"
for _ in $(seq 1 100); do [ -e "$run.stop" ] && break; sleep 0.1; done
[ -e "$run.stop" ] || { cat "$run.log"; echo "the first signal created no stop file"; exit 1; }
kill -USR1 "$pid"
finish "$run" 60
[ "$code" -eq 138 ] || { cat "$run.log"; echo "a second signal (SIGUSR1): expected exit 138, got $code"; exit 1; }
grep -q "SIGUSR1 again: stopping at once" "$run.log"
[ ! -e "$run.stop" ] || { echo "the stop file outlived the run"; exit 1; }
! pgrep -f "sleep 86321" >/dev/null || { echo "ranks are left running"; exit 1; }
echo "second signal to launch/mpirun.sh: stopped at once, exit 138"

run="$work/kill"
start "$run"
wait_for_steps "$run"
victim=$(pgrep -P "$pid" | tail -n 1)
began=$(date +%s)
kill -KILL "$victim"
finish "$run" 60
elapsed=$(( $(date +%s) - began ))
[ "$code" -ne 0 ] || { cat "$run.log"; echo "the job exited 0 after a rank was killed"; exit 1; }
echo "SIGKILL of one rank: job ended with code $code after $elapsed s"
echo "graceful stop e2e: OK"
