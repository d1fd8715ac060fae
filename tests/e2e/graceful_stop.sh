#!/usr/bin/env bash
# Signals: SIGTERM and SIGUSR1 to the ranks (as Slurm delivers them to the tasks) make every rank
# checkpoint at the next step boundary and exit with code 75; a rank killed hard brings the whole
# job down within a bounded time instead of leaving the others waiting. (SIGUSR1 goes to the ranks,
# not to mpirun: not every Open MPI 4.1 installation forwards it.)
#   tests/e2e/graceful_stop.sh BIN_DIR
source "$(dirname "$0")/common.sh"
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
start() { # in the background of this shell, so that it can wait for it; sets pid
  mpirun --oversubscribe --bind-to none -np 2 "$bin/myriad-train" --data synthetic --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --batch-size 8 --max-steps 100000 --log-every 10 \
    --workers 1 --threads 1 --log-level warn --run-dir "$1" >"$1.log" 2>&1 &
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

for how in term usr1; do
  run="$work/$how"
  start "$run"
  wait_for_steps "$run"
  pkill "-${how^^}" -P "$pid"
  finish "$run" 60
  [ "$code" -eq 75 ] || { cat "$run.log"; echo "SIG${how^^}: expected exit 75, got $code"; exit 1; }
  step=$(sed 's/step-0*//' "$run/checkpoints/LATEST")
  [ "$step" -gt 0 ] && "$bin/myriad-ckpt" inspect "$run/checkpoints" >/dev/null
  echo "SIG${how^^}: checkpoint at step $step, exit 75"
done

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
