#!/usr/bin/env bash
# myriad executables under Open MPI's mpirun, one rank per GPU.
#
#   launch/mpirun.sh [-n RANKS] [--hosts H1,H2,... | --hostfile FILE] [--gpus-per-node G]
#                    [--exe PATH] [--stop-file PATH] [--grace SECONDS] [--dry-run]
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
#
# Every NCCL_*, MYRIAD_*, UCX_*, CUDA_* and OMP_* variable set here is passed to every rank, and
# so are PATH and LD_LIBRARY_PATH; OMPI_MCA_* variables configure mpirun itself. As root, mpirun
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
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
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

command=(mpirun --bind-to none)
if [ -n "$hostfile" ]; then
  slots=$(awk '!/^[[:space:]]*(#|$)/ { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7); s += n }
               END { print s + 0 }' "$hostfile")
  [ "$slots" -gt 0 ] || usage_error "hostfile '$hostfile' lists no hosts"
  # More ranks than slots would share GPUs; mpirun itself refuses it, in a banner of many lines.
  [ -z "$ranks" ] || [ "$ranks" -le "$slots" ] || [ "${OMPI_MCA_rmaps_base_oversubscribe:-0}" = 1 ] \
    || usage_error "-n $ranks is more than the $slots slots of '$hostfile' (one rank per GPU)"
  command+=(--hostfile "$hostfile" -np "${ranks:-$slots}")
elif [ -n "$hosts" ]; then
  IFS=, read -r -a host_list <<<"$hosts"
  spec=""
  for h in "${host_list[@]}"; do spec+="${spec:+,}$h:$gpus_per_node"; done
  command+=(--host "$spec" -np "${ranks:-$(( ${#host_list[@]} * gpus_per_node ))}")
else
  command+=(-np "${ranks:-$gpus_per_node}")
fi
# One rank per GPU: ranks fill a node's slots in order, so local rank i takes GPU i.
command+=(--map-by slot)
# Open MPI's daemons notice a peer daemon whose host went silent (a dead node, a cut link) within
# about 30 s instead of 5 minutes of TCP keepalive defaults; an OMPI_MCA_* setting wins.
for keepalive in time=10 intvl=5 probes=4; do
  name=OMPI_MCA_oob_tcp_keepalive_${keepalive%=*}
  [ -n "${!name:-}" ] || command+=(--mca "oob_tcp_keepalive_${keepalive%=*}" "${keepalive#*=}")
done
# The stop request, and the time from which a request counts (an older file is from another run).
export MYRIAD_STOP_FILE=$stop_file MYRIAD_STOP_SINCE
MYRIAD_STOP_SINCE=$(date +%s.%N)
for name in PATH LD_LIBRARY_PATH $(compgen -e | grep -E '^(NCCL|MYRIAD|UCX|CUDA|OMP)_' || true); do
  [ -z "${!name+set}" ] || command+=(-x "$name")
done
command+=("$exe" "$@")

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
# The bash that setsid starts leads the new session; it starts the watcher and becomes mpirun.
setsid bash -c 'watch_wrapper "$1" "$2" "$3" "$$" & shift 3; exec "$@"' watcher "$$" "$stop_file" "$grace" \
  "${command[@]}" &
pid=$!
trap 'on_signal SIGUSR1' USR1
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
# A shell cannot trap a signal ignored when it started: under nohup, SIGHUP stays ignored.
trap 'on_signal SIGHUP' HUP
set +e
while :; do
  wait "$pid"
  code=$?
  # wait returns early (above 128) when a trapped signal arrives; mpirun is still running.
  kill -0 "$pid" 2>/dev/null || break
done
rm -f "$stop_file"
case "$stopped_hard" in
  SIGHUP) exit 129 ;;
  SIGUSR1) exit 138 ;;
  SIGTERM) exit 143 ;;
  SIGINT) exit 130 ;;
esac
exit "$code"
