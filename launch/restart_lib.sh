# shellcheck shell=bash
# What launch/mpirun.sh and launch/slurm/train.sbatch share to restart a failed job on the hosts
# that remain (docs/multi-node.md, "Restarts and stragglers"). Sourced; every function is
# prefixed restart_.

# The step of CHECKPOINT_DIR's LATEST ("step-000000040" -> 40), or 0 without one.
restart_latest_step() {
  local latest
  latest=$(cat "$1/LATEST" 2>/dev/null) || { echo 0; return; }
  latest=${latest##*step-}
  echo $((10#${latest:-0}))
}

# When the newest checkpoint of CHECKPOINT_DIR was published (seconds since the epoch), else
# FALLBACK: the work after it is what a failure loses.
restart_checkpoint_time() {
  stat -c %Y "$1/LATEST" 2>/dev/null || echo "$2"
}

# The value of the executable's option NAME (--NAME VALUE or --NAME=VALUE) among ARGS, the last
# one given; empty without one.
restart_option_value() {
  local name=$1 value="" previous=""
  shift
  for arg in "$@"; do
    [ "$previous" != "--$name" ] || value=$arg
    case "$arg" in --"$name"=*) value=${arg#*=} ;; esac
    previous=$arg
  done
  echo "$value"
}

# ARGS without any --resume (its value too), so that a restart can add --resume auto; in the
# array restart_args.
restart_without_resume() {
  restart_args=()
  local skip=false
  for arg in "$@"; do
    if $skip; then skip=false; continue; fi
    case "$arg" in
      --resume) skip=true ;;
      --resume=*) ;;
      *) restart_args+=("$arg") ;;
    esac
  done
}

# A JSON string of TEXT (quotes and backslashes escaped; host names and short reasons only).
restart_json_string() {
  local text=${1//\\/\\\\}
  printf '"%s"' "${text//\"/\\\"}"
}

# Appends the {"kind":"restart"} record to METRICS (the run's metrics.jsonl) and logs its line:
#   restart_record METRICS LOG_PREFIX ATTEMPT MAX W_BEFORE W_AFTER STEP SECONDS_LOST EXIT_CODE \
#                  DROPPED... (each "host: why")
restart_record() {
  local metrics=$1 prefix=$2 attempt=$3 max=$4 before=$5 after=$6 step=$7 lost=$8 code=$9
  shift 9
  local dropped="" names="" entry
  for entry in "$@"; do
    dropped+="${dropped:+,}{\"host\":$(restart_json_string "${entry%%: *}"),\"why\":$(restart_json_string "${entry#*: }")}"
    names+="${names:+, }${entry%%: *}"
  done
  echo "$prefix: restart $attempt of $max after exit code $code: ${names:-no host} dropped, $before -> $after ranks, resuming from step $step ($lost s lost)" >&2
  mkdir -p "$(dirname "$metrics")"
  printf '{"kind":"restart","attempt":%d,"max_restarts":%d,"exit_code":%d,"hosts_dropped":[%s],"world_size_before":%d,"world_size_after":%d,"resumed_from_step":%d,"seconds_lost":%d,"time":%s}\n' \
    "$attempt" "$max" "$code" "$dropped" "$before" "$after" "$step" "$lost" "$(date +%s)" >>"$metrics"
}
