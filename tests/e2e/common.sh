# Sourced by the e2e scripts, whose first argument is the directory of the executables: strict
# mode, `bin`, and a scratch directory `work` removed on exit.
set -euo pipefail
bin=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# small_train RANKS [myriad-train options]: smallcnn on 16x16 synthetic images (or $data) of 37 classes, one
# thread and one loader worker per rank. The log level comes from $level (default warn), the
# ranks' binding from $bind (default none: more ranks than cores share them). It runs
# on the CPU even where there are GPUs, because the tests compare losses bit for bit and cuDNN's
# convolutions are not deterministic; the GPU paths have their own multi-rank tests.
small_train() {
  local ranks=$1
  shift
  mpirun --oversubscribe --bind-to "${bind:-none}" -np "$ranks" "$bin/myriad-train" --data "${data:-synthetic}" --input-shape 1x16x16 \
    --backbone smallcnn --embedding-size 32 --num-classes 37 --workers 1 --threads 1 --device cpu \
    --log-level "${level:-warn}" "$@"
}

# The losses a run directory's metrics.jsonl logged, one per line.
losses() { grep -o '"loss":[-0-9.eE+]*' "$1/metrics.jsonl" | cut -d: -f2; }

# python_with MODULE...: prints a python3 that imports every MODULE (Debian's /usr/bin/python3
# first: a pyenv python3 on PATH may lack the Debian packages python3-h5py, python3-torch);
# without one, the test is skipped (exit 77).
python_with() {
  local py
  for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  echo "SKIP: no python3 with $*" >&2
  exit 77
}

# The hang tests (hang_watchdog.sh, cuda_graphs_gpu.sh). guard_ranks: as root, no rank of this
# test outlives it, whatever happens, and fail prints why with the tail of every log in $work.
guard_ranks() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  trap 'pkill -KILL -f "myriad-train.*$work" || true; rm -rf "$work"' EXIT
  fail() {
    echo "FAILED: $*"
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done
    exit 1
  }
}

# rank_pid RUN_DIR RANK: the pid of that
# rank of the myriad-train run writing RUN_DIR.
rank_pid() {
  local pid
  for pid in $(pgrep -f "myriad-train.*$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}

# latest_step RUN_DIR: the step of the checkpoint that RUN_DIR's LATEST names; nothing without one.
latest_step() { sed 's/^step-0*//' "$1/checkpoints/LATEST" 2>/dev/null || true; }
job_running() { kill -0 "$job" 2>/dev/null; } # the background job $job has not ended

# wait_for_checkpoint RUN_DIR STEP SECONDS [ALIVE]: until RUN_DIR's LATEST names the checkpoint of
# STEP or a later one (a step's metrics record comes before its checkpoint's commit, so a record
# is not enough). Calls the caller's fail, after RUN_DIR.log where there is one, when SECONDS pass
# or as soon as the command ALIVE fails: the job cannot publish it any more (default job_running).
wait_for_checkpoint() {
  local run=$1 step=$2 seconds=$3 alive=${4:-job_running} i latest
  for ((i = 0; i < seconds * 10; i++)); do
    latest=$(latest_step "$run")
    [ "${latest:-0}" -ge "$step" ] && return 0
    "$alive" || { [ ! -f "$run.log" ] || cat "$run.log"; fail "the job ended before the checkpoint of step $step"; }
    sleep 0.1
  done
  [ ! -f "$run.log" ] || cat "$run.log"
  fail "no checkpoint of step $step within $seconds s"
}

# stall_rank RUN_DIR RANK TIMEOUT: once the run of the background job $job has published a
# checkpoint in RUN_DIR, stops its rank RANK (SIGSTOP: alive and silent, as behind a cut link) and
# waits for the job, which must end non-zero within TIMEOUT + 60 s; sets code and took (seconds).
# Calls the caller's fail otherwise.
stall_rank() {
  local run=$1 rank=$2 timeout=$3 victim stopped_at
  wait_for_checkpoint "$run" 1 120
  victim=$(rank_pid "$run" "$rank")
  [ -n "$victim" ] || fail "rank $rank not found"
  kill -STOP "$victim"
  stopped_at=$(date +%s)
  set +e
  wait "$job"
  code=$?
  set -e
  took=$(($(date +%s) - stopped_at))
  [ "$code" -ne 0 ] || fail "the job exited 0 after a rank stopped"
  [ "$took" -le $((timeout + 60)) ] || fail "the job took $took s to end (timeout $timeout s)"
}
