# shellcheck shell=bash
# Jobs on the hosts of tests/support/netns_cluster.sh, for the e2e tests that start, stop and
# break them (multi_host.sh, auto_restart.sh): `source` it after common.sh; it sources
# netns_cluster.sh and sets $repo and $launch (launch/mpirun.sh). The test defines long_train
# (small_train of its run that goes on until stopped), which start runs; launch_options (an
# array) adds options of launch/mpirun.sh.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$repo/tests/support/netns_cluster.sh"
launch=$repo/launch/mpirun.sh

# job_cluster_up N: hosts myrh1..myrhN (torn down on exit), the working directory $work, and
# $work/hosts-Nx1, a hostfile of one slot on each host.
job_cluster_up() {
  cluster_up "$1"
  cd "$work"
  local h
  for h in $(seq 1 "$1"); do echo "myrh$h slots=1"; done >"$work/hosts-$1x1"
}

# small_train's mpirun: with $hostfile set, the same ranks go through launch/mpirun.sh inside myrh1
# (a login node) to the hosts of $hostfile, each rank running $exe (default myriad-train).
mpirun() {
  [ -n "${hostfile:-}" ] || { command mpirun "$@"; return; }
  local ranks=""
  while [ "$1" != "$bin/myriad-train" ]; do
    [ "$1" != -np ] || ranks=$2
    shift
  done
  shift
  cluster_exec myrh1 "$launch" --hostfile "$hostfile" -n "$ranks" ${launch_options[@]+"${launch_options[@]}"} \
    --exe "${exe:-$bin/myriad-train}" -- "$@"
}
fail() {
  echo "$*"
  exit 1
}
start() { # RUN_DIR [options]: a long run on $hostfile in the background; sets job, and pid (the wrapper's)
  local run=$1
  level=info long_train --run-dir "$run" "${@:2}" >"$run.log" 2>&1 &
  job=$!
  pid=""
  for _ in $(seq 1 100); do
    pid=$(pgrep -P "$job" -f "$launch" || true)
    [ -z "$pid" ] || return 0
    sleep 0.1
  done
  fail "launch/mpirun.sh did not start"
}
wait_for_steps() { # RUN_DIR: until metrics.jsonl has a record
  for _ in $(seq 1 600); do
    [ -s "$1/metrics.jsonl" ] && return 0
    kill -0 "$job" 2>/dev/null || { cat "$1.log"; fail "the job ended before its first step"; }
    sleep 0.1
  done
  cat "$1.log"
  fail "training did not start"
}
finish() { # RUN_DIR SECONDS: waits that long at most for the job to end; sets code and elapsed
  local began
  began=$(date +%s)
  timeout "$2" tail --pid="$job" -f /dev/null || true
  elapsed=$(($(date +%s) - began))
  kill -0 "$job" 2>/dev/null && { cat "$1.log"; fail "the job was still running $2 s later"; }
  set +e
  wait "$job"
  code=$?
  set -e
}
left() { # the processes left in the hosts, as "HOST: PID COMMAND LINE"
  local host
  for host in "${CLUSTER_HOSTS[@]}"; do cluster_ps "$host" | sed "s/^/$host: /"; done
}
nothing_left() { # WHAT [SECONDS [IGNORED]]: within SECONDS (default 10), no process left in any host
  local ignored=${3:-^$}            # but those whose line matches the regular expression IGNORED
  for _ in $(seq 1 $((${2:-10} * 10))); do
    [ -n "$(left | grep -Ev "$ignored")" ] || return 0
    sleep 0.1
  done
  left
  fail "$1: processes are left ${2:-10} s after the job ended"
}
