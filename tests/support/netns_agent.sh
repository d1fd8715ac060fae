#!/usr/bin/env bash
# Open MPI's rsh agent for the hosts of tests/support/netns_cluster.sh, called as ssh would be:
#   netns_agent.sh [ssh options] HOST COMMAND...
# It runs COMMAND with /bin/sh inside HOST (its network, hostname and mounts, found in
# $CLUSTER_DIR/map), in the home directory, with the sparse environment of an ssh login: mpirun
# must pass on what its ranks need, as it would on real hosts.
set -euo pipefail
# ssh options: those that take a value, then flags (mpirun adds e.g. -x when the agent is ssh).
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -[bcDEeFIiJLlmOopQRSWw]*|-[46AaCfGgKkMNnqsTtVvXxYy]*) shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "netns_agent.sh: usage: netns_agent.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift
map=${CLUSTER_DIR:?netns_agent.sh: CLUSTER_DIR is not set (no cluster_up)}/map
holder=$(awk -v h="$host" '$1 == h { print $3 }' "$map")
# ssh's exit code for a host it cannot reach.
[ -n "$holder" ] || { echo "netns_agent.sh: no host '$host' in $map" >&2; exit 255; }
kill -0 "$holder" 2>/dev/null || { echo "netns_agent.sh: host '$host' is down" >&2; exit 255; }
exec nsenter -t "$holder" --net --uts --mount --wd="${HOME:-/}" -- \
  env -i HOME="${HOME:-/}" USER="${USER:-$(id -un)}" LOGNAME="${LOGNAME:-$(id -un)}" SHELL=/bin/sh \
  PATH="$PATH" CLUSTER_DIR="$CLUSTER_DIR" /bin/sh -c "$*"
