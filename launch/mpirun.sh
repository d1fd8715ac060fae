#!/usr/bin/env bash
# myriad executables under Open MPI's mpirun, one rank per GPU.
#
#   launch/mpirun.sh [-n RANKS] [--hosts H1,H2,... | --hostfile FILE] [--gpus-per-node G]
#                    [--exe PATH] [--stop-file PATH] [--grace SECONDS] [--dry-run]
#                    [--max-restarts N [--min-ranks R] [--probe-timeout SECONDS]]
#                    [--] [options of the executable]
#
#   launch/mpirun.sh --hostfile hosts.txt -- --config configs/ms1mv3_r50.ini --run-dir runs/r50
#   launch/mpirun.sh --hosts node1,node2 --exe build/bin/myriad-bench -- collectives --backend nccl
#
# -n              ranks in all (default: GPUs per node x nodes, or the slots of the hostfile)
# --hosts         nodes, each running --gpus-per-node ranks
# --hostfile      an Open MPI hostfile ("node1 slots=8" per line); ranks fill each node's slots
# --gpus-per-node ranks per node (default: the GPUs nvidia-smi lists here, else 1)
# --exe           the executable (default: MYRIAD_TRAIN, else build/bin/myriad-train)
# --stop-file     the stop request the ranks watch (default: MYRIAD_STOP_FILE, else
#                 .myriad-stop.HOST.PID in the current directory); every node must see it
# --grace         how long a job whose launcher was killed may take to checkpoint and stop before
#                 it is killed (default 600 seconds)
# --dry-run       print the mpirun command instead of running it
# --max-restarts  restart a failed job (exit neither 0 nor 75) up to N times (default 0: never), on
#                 the hosts that still answer and whose ranks did not die, with --resume auto from
#                 the newest checkpoint; needs --hostfile or --hosts, and the executable's --run-dir
# --min-ranks     restart only on at least R ranks (default 1); fewer ends the job
# --probe-timeout how long a host may take to answer the probe before a restart (default 15 s)
#
# Restarts (docs/multi-node.md, "Restarts and stragglers"): each host is probed as Open MPI
# reaches it (a one-rank mpirun through the same agent, ssh or OMPI_MCA_plm_rsh_agent, whose daemon
# calls back over TCP). The job goes on with the ranks the remaining hosts' slots hold and the
# same per-rank --batch-size: the global batch shrinks with the ranks. Each restart is one line
# here and one {"kind": "restart"} record in RUN_DIR/metrics.jsonl.
#
# Every NCCL_*, MYRIAD_*, UCX_*, CUDA_*, OMP_* and OPENBLAS_* variable set here is passed to every
# rank (OpenBLAS's core type picks its GEMM kernels, and so the CPU's rounding: ranks on other
# hosts must not pick theirs), and so are PATH and LD_LIBRARY_PATH; OMPI_MCA_* variables configure
# mpirun itself. As root, mpirun
# needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
#
# Stopping (docs/training.md, "Stopping and preemption"): mpirun runs as a child in a session of
# its own, so a signal meant for the job reaches this script and never mpirun, whose forwarding
# differs between installations. SIGUSR1, SIGTERM, SIGINT (Ctrl-C) or SIGHUP (a lost terminal or
# ssh connection; under nohup it stays ignored) creates the stop file, which the ranks watch: they
# agree at the next step boundary, write one checkpoint however long it takes, and exit; this
# script then exits 75. A second signal stops at once: mpirun gets SIGTERM and kills the ranks,
# the checkpoint being written is abandoned (the previous one stays), and this script exits 128 +
# the signal's number. A hard-killed rank brings the whole job down. If this script itself is
# killed (SIGKILL), a watcher in mpirun's session creates the stop file within a second or two,
# and kills whatever of the job is left after --grace seconds: no job outlives its launcher.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=""
hosts=""
hostfile=""
gpus_per_node=""
exe=${MYRIAD_TRAIN:-$repo/build/bin/myriad-train}
stop_file=${MYRIAD_STOP_FILE:-$PWD/.myriad-stop.$(hostname -s).$$}
grace=600
dry_run=false
max_restarts=0
min_ranks=1
probe_timeout=15

usage_error() {
  echo "mpirun.sh: $*; see launch/mpirun.sh --help" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--ranks) ranks=${2:?}; shift 2 ;;
    --hosts) hosts=${2:?}; shift 2 ;;
    --hostfile) hostfile=${2:?}; shift 2 ;;
    --gpus-per-node) gpus_per_node=${2:?}; shift 2 ;;
    --exe) exe=${2:?}; shift 2 ;;
    --stop-file) stop_file=${2:?}; shift 2 ;;
    --grace) grace=${2:?}; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    --max-restarts) max_restarts=${2:?}; shift 2 ;;
    --min-ranks) min_ranks=${2:?}; shift 2 ;;
    --probe-timeout) probe_timeout=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) usage_error "unknown option '$1' (options of the executable go after --)" ;;
    *) break ;;
  esac
done

is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
[ -z "$hosts" ] || [ -z "$hostfile" ] || usage_error "--hosts and --hostfile exclude each other"
[ -z "$ranks" ] || is_count "$ranks" || usage_error "-n must be a positive number, not '$ranks'"
[ -z "$hostfile" ] || [ -r "$hostfile" ] || usage_error "hostfile '$hostfile' is not readable"
[ -x "$exe" ] || usage_error "'$exe' is not an executable (build with scripts/setup.sh, or pass --exe)"
if [ -z "$gpus_per_node" ]; then
  gpus_per_node=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
  [ "$gpus_per_node" -gt 0 ] 2>/dev/null || gpus_per_node=1
fi
is_count "$gpus_per_node" || usage_error "--gpus-per-node must be a positive number, not '$gpus_per_node'"
is_count "$grace" || usage_error "--grace must be a positive number of seconds, not '$grace'"
[[ "$max_restarts" =~ ^[0-9]+$ ]] \
  || usage_error "--max-restarts must be a number of restarts (0 or more), not '$max_restarts'"
is_count "$min_ranks" || usage_error "--min-ranks must be a positive number, not '$min_ranks'"
is_count "$probe_timeout" || usage_error "--probe-timeout must be a positive number of seconds, not '$probe_timeout'"
source "$repo/launch/restart_lib.sh"
run_dir=$(restart_option_value run-dir "$@")
if [ "$max_restarts" -gt 0 ]; then
  [ -n "$hostfile$hosts" ] || usage_error "--max-restarts needs --hostfile or --hosts (the hosts to restart on)"
  [ -n "$run_dir" ] || usage_error "--max-restarts needs the executable's --run-dir (its checkpoints and metrics.jsonl)"
fi

# The hosts and their slots, in the hostfile's order: what a restart chooses from.
host_names=()
host_slots=()
if [ -n "$hostfile" ]; then
  while read -r h n; do
    host_names+=("$h")
    host_slots+=("$n")
  done < <(awk '!/^[[:space:]]*(#|$)/ { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7); print $1, n }' "$hostfile")
  slots=0
  for n in "${host_slots[@]}"; do slots=$((slots + n)); done
  [ "$slots" -gt 0 ] || usage_error "hostfile '$hostfile' lists no hosts"
  # More ranks than slots would share GPUs; mpirun itself refuses it, in a banner of many lines.
  [ -z "$ranks" ] || [ "$ranks" -le "$slots" ] || [ "${OMPI_MCA_rmaps_base_oversubscribe:-0}" = 1 ] \
    || usage_error "-n $ranks is more than the $slots slots of '$hostfile' (one rank per GPU)"
  [ "$min_ranks" -le "$slots" ] \
    || usage_error "--min-ranks $min_ranks is more than the $slots slots of '$hostfile': the job could never run"
  placement=(--hostfile "$hostfile")
elif [ -n "$hosts" ]; then
  IFS=, read -r -a host_names <<<"$hosts"
  spec=""
  for h in "${host_names[@]}"; do
    spec+="${spec:+,}$h:$gpus_per_node"
    host_slots+=("$gpus_per_node")
  done
  slots=$(( ${#host_names[@]} * gpus_per_node ))
  [ "$min_ranks" -le "$slots" ] \
    || usage_error "--min-ranks $min_ranks is more than the $slots slots of --hosts: the job could never run"
  placement=(--host "$spec")
else
  slots=$gpus_per_node
  placement=()
fi
world=${ranks:-$slots}
# One rank per GPU: ranks fill a node's slots in order, so local rank i takes GPU i.
options=(--map-by slot)
# Open MPI's daemons notice a peer daemon whose host went silent (a dead node, a cut link) within
# about 30 s instead of 5 minutes of TCP keepalive defaults; an OMPI_MCA_* setting wins.
for keepalive in time=10 intvl=5 probes=4; do
  name=OMPI_MCA_oob_tcp_keepalive_${keepalive%=*}
  [ -n "${!name:-}" ] || options+=(--mca "oob_tcp_keepalive_${keepalive%=*}" "${keepalive#*=}")
done
# The stop request, and the time from which a request counts (an older file is from another run).
export MYRIAD_STOP_FILE=$stop_file MYRIAD_STOP_SINCE
MYRIAD_STOP_SINCE=$(date +%s.%N)
for name in PATH LD_LIBRARY_PATH $(compgen -e | grep -E '^(NCCL|MYRIAD|UCX|CUDA|OMP|OPENBLAS)_' || true); do
  [ -z "${!name+set}" ] || options+=(-x "$name")
done
command=(mpirun --bind-to none "${placement[@]}" -np "$world" "${options[@]}" "$exe" "$@")

if $dry_run; then
  printf '%q ' "${command[@]}"
  echo
  exit 0
fi

rm -f "$stop_file"
touch "$stop_file.probe" 2>/dev/null && rm -f "$stop_file.probe" \
  || usage_error "cannot create the stop file '$stop_file' (--stop-file: a writable path every node sees)"
# Whether process $1 runs: a zombie (a killed wrapper its parent has not waited for) does not.
alive() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ]
}
# Runs in mpirun's session, started just before mpirun: once the wrapper $1 is gone while mpirun
# ($4, the session's leader) still runs, it asks the ranks to stop through the stop file $2, and
# after $3 seconds kills every process left in the session.
watch_wrapper() {
  local wrapper=$1 stop=$2 grace=$3 job=$4 waited=0
  while alive "$wrapper"; do
    alive "$job" || exit 0
    sleep 1
  done
  alive "$job" || exit 0
  echo "mpirun.sh: the launcher (pid $wrapper) is gone: asking the ranks to checkpoint and stop ($stop)" >&2
  : >"$stop"
  while alive "$job" && [ "$waited" -lt "$grace" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  if alive "$job"; then
    echo "mpirun.sh: the job did not stop within --grace $grace s: killing it" >&2
    kill -TERM "$job" 2>/dev/null
    # mpirun's own escalation to SIGKILL, then ours.
    for waited in 1 2 3 4 5; do alive "$job" && sleep 1; done
  fi
  rm -f "$stop"
  # Ranks that outlived mpirun, and this watcher.
  pkill -KILL -s "$job"
}
export -f alive watch_wrapper

# Whether Open MPI reaches host $1 as it would to start ranks there: a one-rank mpirun, whose
# daemon the same agent starts and which calls back over TCP, within --probe-timeout.
probe_host() {
  timeout -k 2 "$probe_timeout" mpirun --host "$1:1" -np 1 true </dev/null >/dev/null 2>&1
}

# Why host $1 leaves the job after the attempt whose mpirun stderr is $2, or nothing: it did not
# answer the probe (whose status is in file $3), or mpirun saw one of its ranks killed by a signal.
drop_reason() {
  if [ "$(cat "$3" 2>/dev/null)" != 0 ]; then
    echo "no answer within $probe_timeout s through ${OMPI_MCA_plm_rsh_agent:-ssh}"
    return
  fi
  # "mpirun noticed that process rank 2 with PID 77 on node h2 exited on signal 9 (Killed)."
  awk -v h="$1" '/noticed that process rank [0-9]+ with PID .* on node .* exited on signal/ {
      for (i = 1; i < NF; i++) { if ($i == "rank") r = $(i + 1); if ($i == "node") n = $(i + 1); if ($i == "signal") s = $(i + 1) }
      if (n == h) { print "its rank " r " died of signal " s; exit } }' "$2"
}

# Probes every host still in the job at once; keeps in host_names/host_slots those that answer and
# whose ranks lived; sets dropped ("host: why" each).
drop_hosts() {
  local errlog=$1 i reason kept_names=() kept_slots=()
  for i in "${!host_names[@]}"; do
    (probe_host "${host_names[$i]}"; echo $? >"$state/probe.$i") &
  done
  wait
  dropped=()
  for i in "${!host_names[@]}"; do
    reason=$(drop_reason "${host_names[$i]}" "$errlog" "$state/probe.$i")
    if [ -n "$reason" ]; then
      dropped+=("${host_names[$i]}: $reason")
      echo "mpirun.sh: dropping host ${host_names[$i]}: $reason" >&2
    else
      kept_names+=("${host_names[$i]}")
      kept_slots+=("${host_slots[$i]}")
    fi
  done
  host_names=("${kept_names[@]}")
  host_slots=("${kept_slots[@]}")
}

# The job, restarted after each failure on the hosts that remain; sets code. $@: the executable's
# options.
restart_loop() {
  local attempt=0 first_started checkpoints step lost before n i
  checkpoints=$(restart_option_value checkpoint-dir "$@")
  checkpoints=${checkpoints:-$run_dir/checkpoints}
  state=$(mktemp -d)
  restart_without_resume "$@"
  first_started=$(date +%s)
  while :; do
    run_job "$state/attempt-$attempt.err"
    # Success, a checkpointed stop (75), or a stop asked for here: nothing to restart.
    { [ "$code" -eq 0 ] || [ "$code" -eq 75 ] || [ "$signals" -gt 0 ]; } && break
    if [ "$code" -eq 2 ]; then
      echo "mpirun.sh: the executable refused its options (exit 2): not restarting" >&2
      break
    fi
    if [ "$attempt" -ge "$max_restarts" ]; then
      echo "mpirun.sh: the job failed with exit code $code after $attempt restart(s): --max-restarts $max_restarts reached, giving up" >&2
      break
    fi
    drop_hosts "$state/attempt-$attempt.err"
    before=$world
    world=0
    for n in "${host_slots[@]}"; do world=$((world + n)); done
    [ -z "$ranks" ] || [ "$world" -le "$ranks" ] || world=$ranks
    if [ "$world" -lt "$min_ranks" ]; then
      echo "mpirun.sh: the job failed with exit code $code and the hosts left (${host_names[*]:-none}) hold $world rank(s), fewer than --min-ranks $min_ranks: giving up" >&2
      break
    fi
    attempt=$((attempt + 1))
    : >"$state/hosts"
    for i in "${!host_names[@]}"; do echo "${host_names[$i]} slots=${host_slots[$i]}" >>"$state/hosts"; done
    step=$(restart_latest_step "$checkpoints")
    lost=$(($(date +%s) - $(restart_checkpoint_time "$checkpoints" "$first_started")))
    restart_record "$run_dir/metrics.jsonl" mpirun.sh "$attempt" "$max_restarts" "$before" "$world" "$step" "$lost" \
      "$code" "${dropped[@]}"
    command=(mpirun --bind-to none --hostfile "$state/hosts" -np "$world" "${options[@]}" "$exe" "${restart_args[@]}" --resume auto)
  done
  rm -rf "$state"
}

signals=0
on_signal() {
  signals=$((signals + 1))
  if [ "$signals" -eq 1 ]; then
    echo "mpirun.sh: $1: asking the ranks to checkpoint and stop ($stop_file); a second signal stops at once" >&2
    : >"$stop_file"
  else
    echo "mpirun.sh: $1 again: stopping at once, without a checkpoint" >&2
    stopped_hard=$1
    kill -TERM "$pid" 2>/dev/null || true
  fi
}
stopped_hard=""
trap 'on_signal SIGUSR1' USR1
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
# A shell cannot trap a signal ignored when it started: under nohup, SIGHUP stays ignored.
trap 'on_signal SIGHUP' HUP
# Runs $command to its end; sets code. With an ERRLOG, mpirun's stderr (its own messages and the
# ranks') is also copied there, for the restart to read which ranks died where.
run_job() {
  local errlog=${1:-}
  # The bash that setsid starts leads the new session; it starts the watcher and becomes mpirun.
  setsid bash -c 'watch_wrapper "$1" "$2" "$3" "$$" & log=$4; shift 4
                  if [ -n "$log" ]; then exec "$@" 2> >(tee -a "$log" >&2); else exec "$@"; fi' \
    watcher "$$" "$stop_file" "$grace" "$errlog" "${command[@]}" &
  pid=$!
  while :; do
    wait "$pid"
    code=$?
    # wait returns early (above 128) when a trapped signal arrives; mpirun is still running.
    kill -0 "$pid" 2>/dev/null || break
  done
}
set +e
if [ "$max_restarts" -eq 0 ]; then
  run_job
else
  restart_loop "$@"
fi
rm -f "$stop_file"
case "$stopped_hard" in
  SIGHUP) exit 129 ;;
  SIGUSR1) exit 138 ;;
  SIGTERM) exit 143 ;;
  SIGINT) exit 130 ;;
esac
exit "$code"
