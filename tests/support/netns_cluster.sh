# shellcheck shell=bash
# A cluster of hosts on one machine, for multi-host tests: `source` it (as root), then
#
#   cluster_up N                 hosts myrh1..myrhN; tears itself down on EXIT
#   cluster_exec HOST CMD...     runs CMD inside HOST (its network, hostname and mounts), with this
#                                shell's environment and working directory
#   cluster_cut HOST             takes HOST's link down (cluster_heal HOST brings it back)
#   cluster_slow HOST RATE       limits HOST's outgoing traffic to RATE (tc units: 1mbit, 200kbit);
#                                RATE "off" removes the limit
#   cluster_private_dir HOST DIR gives HOST an empty private tmpfs over DIR (an unshared directory)
#   cluster_pids HOST            the processes left in HOST, one id a line
#   cluster_ps HOST              the same, as "PID COMMAND LINE"
#   cluster_kill HOST SIGNAL [NAME]  sends SIGNAL to HOST's processes (those named NAME only)
#   cluster_down                 kills every process left in the hosts and removes them (idempotent)
#
# Exports CLUSTER_HOSTS (array of host names), CLUSTER_AGENT (Open MPI's rsh agent), CLUSTER_DIR,
# and the OMPI_MCA_* settings that make mpirun reach the hosts through the agent and use TCP on
# their eth0. Start mpirun inside the first host, as on a login node:
#   cluster_exec myrh1 launch/mpirun.sh --hostfile FILE -- ...
#
# A host is a network namespace (`ip netns`, named per invocation, so clusters can coexist) with
# lo and eth0, a veth on a bridge inside a "switch" namespace of its own: the root namespace gets
# no address, no route and no device. Each host also has its own hostname (UTS namespace) and
# mounts (mount namespace, with a private /etc/hosts naming the hosts), held by one `sleep`
# process that every process entering the host joins. The file system is otherwise shared, as a
# cluster file system would be.

# Open MPI's settings: the agent instead of ssh, TCP on eth0 only (every host's lo has the same
# 127.0.0.1), daemon keepalives short enough that a daemon on a cut-off host is declared lost
# within about 15 s instead of the default 8 minutes, and ranks that yield the CPU while they wait:
# every host believes its slots are cores of its own, but all share this machine's, and ranks
# spinning in MPI made steps over TCP ten times slower. Open MPI's session directories (named by
# host) go into the cluster's directory: clusters with the same host names do not share them, and
# those of killed daemons go with the cluster.
cluster_mca_settings() {
  export OMPI_MCA_plm_rsh_agent=$CLUSTER_AGENT
  export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
  export OMPI_MCA_oob_tcp_keepalive_time=5 OMPI_MCA_oob_tcp_keepalive_intvl=2 OMPI_MCA_oob_tcp_keepalive_probes=5
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_orte_tmpdir_base=$CLUSTER_DIR/tmp
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

cluster_skip() {
  echo "SKIP: $*" >&2
  exit 77
}

# Namespaces of clusters whose shell is gone (killed, e.g. by a test timeout, before its EXIT
# trap ran) are removed, with whatever still runs in them.
cluster_reap_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E '^myriad-c[0-9]+-' || true); do
    owner=${ns#myriad-c}
    owner=${owner%%-*}
    kill -0 "$owner" 2>/dev/null && continue
    cluster_kill_ns "$ns"
    ip netns delete "$ns" 2>/dev/null || true
  done
  local dir
  for dir in "${TMPDIR:-/tmp}"/myriad-c[0-9]*.cluster; do
    owner=${dir##*/myriad-c}
    owner=${owner%%.*}
    [ ! -d "$dir" ] || kill -0 "$owner" 2>/dev/null || rm -rf "$dir"
  done
}

cluster_kill_ns() { # NETNS: SIGKILL to every process in it, until none is left
  local pids _
  for _ in $(seq 1 50); do
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  echo "cluster: processes $pids in $1 survived SIGKILL" >&2
}

cluster_up() {
  local n=${1:?cluster_up N}
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 200 ] || { echo "cluster_up: N must be 1..200, not '$n'" >&2; return 2; }
  [ "$(id -u)" -eq 0 ] || cluster_skip "multi-host tests need root (network namespaces)"
  local tool
  for tool in ip tc unshare nsenter mpirun; do
    command -v "$tool" >/dev/null 2>&1 || cluster_skip "multi-host tests need '$tool'"
  done
  cluster_down
  cluster_reap_stale
  CLUSTER_PREFIX=myriad-c$$
  CLUSTER_SWITCH=$CLUSTER_PREFIX-sw
  CLUSTER_DIR=${TMPDIR:-/tmp}/$CLUSTER_PREFIX.cluster
  rm -rf "$CLUSTER_DIR"
  mkdir -m 0700 "$CLUSTER_DIR" "$CLUSTER_DIR/tmp"
  CLUSTER_AGENT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netns_agent.sh
  CLUSTER_HOSTS=()
  export CLUSTER_DIR CLUSTER_AGENT CLUSTER_HOSTS
  # The EXIT trap already set (common.sh's removal of the work directory) runs after the teardown.
  local previous
  previous=$(trap -p EXIT)
  previous=${previous#trap -- \'}
  previous=${previous%\' EXIT}
  previous=${previous//\'\\\'\'/\'}
  # shellcheck disable=SC2064
  trap "cluster_down; $previous" EXIT

  ip netns add "$CLUSTER_SWITCH" 2>"$CLUSTER_DIR/error" \
    || cluster_skip "cannot create a network namespace: $(head -n 1 "$CLUSTER_DIR/error")"
  # A private /24, the third byte from the shell's id; nothing outside the switch reaches it.
  local subnet=10.213.$(($$ % 250 + 1))
  ip -n "$CLUSTER_SWITCH" link add br0 type bridge
  ip -n "$CLUSTER_SWITCH" link set br0 up
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$CLUSTER_DIR/hosts"
  local k
  for k in $(seq 1 "$n"); do printf '%s.%d myrh%d\n' "$subnet" "$((k + 1))" "$k" >>"$CLUSTER_DIR/hosts"; done
  : >"$CLUSTER_DIR/map"
  for k in $(seq 1 "$n"); do
    local host=myrh$k ns=$CLUSTER_PREFIX-h$k
    ip netns add "$ns"
    ip -n "$CLUSTER_SWITCH" link add "port$k" type veth peer name eth0 netns "$ns"
    ip -n "$CLUSTER_SWITCH" link set "port$k" master br0 up
    ip -n "$ns" link set lo up
    # A connection with data in flight to a host that went silent fails after tcp_retries2
    # retransmissions: Linux's default 15 takes about 15 minutes, and mpirun then waits that long
    # for a cut host's daemon after the ranks ended. 5 is about 13 s. Each namespace has its own
    # value; docs/multi-node.md ("A cut link") gives the cluster setting.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
    ip -n "$ns" addr add "$subnet.$((k + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    # The holder: enters the namespace, takes the host name and the hosts file, and sleeps.
    ip netns exec "$ns" unshare --uts --mount --propagation private sh -c \
      'hostname "$1" && mount --bind "$2/hosts" /etc/hosts && : >"$2/ready.$1" && exec sleep infinity' \
      holder "$host" "$CLUSTER_DIR" </dev/null >/dev/null 2>"$CLUSTER_DIR/error.$host" &
    local holder=$!
    disown "$holder"
    local _
    for _ in $(seq 1 100); do
      [ -e "$CLUSTER_DIR/ready.$host" ] || ! kill -0 "$holder" 2>/dev/null && break
      sleep 0.05
    done
    [ -e "$CLUSTER_DIR/ready.$host" ] \
      || cluster_skip "cannot enter namespaces for host $host: $(head -n 1 "$CLUSTER_DIR/error.$host")"
    echo "$host $ns $holder" >>"$CLUSTER_DIR/map"
    CLUSTER_HOSTS+=("$host")
  done
  cluster_mca_settings
}

# The map's field FIELD (2: namespace, 3: holder process) of HOST.
cluster_lookup() {
  local value
  value=$(awk -v h="$1" -v f="$2" '$1 == h { print $f }' "${CLUSTER_DIR:?no cluster is up}/map")
  [ -n "$value" ] || { echo "cluster: no host '$1' (hosts: ${CLUSTER_HOSTS[*]})" >&2; return 2; }
  echo "$value"
}

cluster_exec() {
  local host=${1:?cluster_exec HOST CMD...} holder
  shift
  holder=$(cluster_lookup "$host" 3) || return
  nsenter -t "$holder" --net --uts --mount --wd="$PWD" -- "$@"
}

cluster_cut() { ip -n "$(cluster_lookup "${1:?cluster_cut HOST}" 2)" link set eth0 down; }
# Forgets the neighbours that failed to answer during the cut, which would otherwise make the host
# unreachable ("no route to host") for a few more seconds.
cluster_heal() {
  ip -n "$(cluster_lookup "${1:?cluster_heal HOST}" 2)" link set eth0 up || return
  local ns
  for ns in $(awk '{ print $2 }' "$CLUSTER_DIR/map"); do ip -n "$ns" neigh flush dev eth0; done
}

cluster_slow() {
  local ns
  ns=$(cluster_lookup "${1:?cluster_slow HOST RATE}" 2) || return
  if [ "${2:?cluster_slow HOST RATE}" = off ]; then
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  else
    tc -n "$ns" qdisc replace dev eth0 root tbf rate "$2" burst 32kbit latency 1s
  fi
}

cluster_private_dir() {
  local host=${1:?cluster_private_dir HOST DIR} dir=${2:?cluster_private_dir HOST DIR} holder
  holder=$(cluster_lookup "$host" 3) || return
  mkdir -p "$dir"
  nsenter -t "$holder" --mount -- mount -t tmpfs -o size=256m,mode=0755 "myriad-private-$host" "$dir"
}

cluster_pids() {
  local ns holder
  ns=$(cluster_lookup "${1:?cluster_pids HOST}" 2) || return
  holder=$(cluster_lookup "$1" 3)
  ip netns pids "$ns" | grep -vx "$holder" || true
}

cluster_ps() {
  local pid command
  for pid in $(cluster_pids "${1:?cluster_ps HOST}"); do
    # A process may end between the listing and the reading.
    command=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") && echo "$pid $command"
  done
  return 0
}

cluster_kill() {
  local host=${1:?cluster_kill HOST SIGNAL [NAME]} signal=${2:?cluster_kill HOST SIGNAL [NAME]} name=${3:-} pid
  for pid in $(cluster_pids "$host"); do
    [ -z "$name" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || continue
    kill "-$signal" "$pid" 2>/dev/null || true
  done
}

cluster_down() {
  [ -n "${CLUSTER_PREFIX:-}" ] || return 0
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$CLUSTER_PREFIX-" || true); do
    cluster_kill_ns "$ns"
    ip netns delete "$ns" 2>/dev/null || true
  done
  [ -z "${CLUSTER_DIR:-}" ] || rm -rf "$CLUSTER_DIR"
  unset CLUSTER_PREFIX CLUSTER_SWITCH
  CLUSTER_HOSTS=()
}
