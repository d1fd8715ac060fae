# A Slurm cluster over the namespace hosts of tests/support/netns_cluster.sh, for the Slurm tests of
# several hosts (sourced after netns_cluster.sh and cluster_up):
#   slurm_hosts_up CLUSTER_NAME [slurm.conf LINE...]
# munged and slurmctld run on myrh1, where Slurm's clients run too (on_login), as on a login node;
# one slurmd per host; all of them keep their files under $slurm on the shared file system. It
# returns when every node is idle. fail MESSAGE prints the daemons' and jobs' logs and exits 1.
source "$(dirname "${BASH_SOURCE[0]}")/slurm_conf.sh"
slurm="$work/slurm"
export SLURM_CONF="$slurm/slurm.conf"

fail() {
  echo "FAILED: $*"
  for f in "$slurm"/*.log "$slurm"/*/slurmd.log "$work"/job-*.out; do [ -f "$f" ] && { echo "== $f"; tail -n 40 "$f"; }; done
  exit 1
}
on_login() { cluster_exec myrh1 "$@"; }

slurm_hosts_up() {
  local name=$1 host count=${#CLUSTER_HOSTS[@]}
  shift
  mkdir -p "$slurm/state"
  for host in "${CLUSTER_HOSTS[@]}"; do mkdir -p "$slurm/$host/spool" "$slurm/$host/tmp"; done
  # One munged for all hosts: its socket is on the shared file system.
  dd if=/dev/urandom of="$slurm/munge.key" bs=1024 count=1 2>/dev/null
  chmod 400 "$slurm/munge.key"
  on_login munged --force --key-file="$slurm/munge.key" --socket="$slurm/munge.sock" --pid-file="$slurm/munged.pid" \
    --log-file="$slurm/munged.log" --seed-file="$slurm/munged.seed" || fail "munged did not start"
  # %n is the node's name: the hosts share this file system, so each slurmd gets its own files. The
  # pmix plugin makes each step's client directory under TmpFS, named by job and step only: one
  # TmpFS for two hosts collides ("spmix_appdir_...: File exists").
  write_slurm_conf "$SLURM_CONF" "$name" myrh1 \
    "NodeName=$(IFS=,; echo "${CLUSTER_HOSTS[*]}") CPUs=$(nproc --all) State=UNKNOWN" \
    "$slurm" "$slurm/%n" "TmpFS=$slurm/%n/tmp" "$@"
  # The hosts' /sys is the fresh sysfs of `ip netns exec`, without the cgroup mounts that slurmd's
  # autodetection looks for ("No filesystem mounted on /sys/fs/cgroup"); with proctrack/linuxproc
  # and task/none, the v1 plugin is loaded but never used.
  echo "CgroupPlugin=cgroup/v1" >"$slurm/cgroup.conf"
  on_login slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
  for host in "${CLUSTER_HOSTS[@]}"; do
    cluster_exec "$host" slurmd -f "$SLURM_CONF" -N "$host" || fail "slurmd on $host did not start"
  done
  for _ in $(seq 1 60); do
    [ "$(on_login sinfo -h -t idle -o %D 2>/dev/null)" = "$count" ] && break
    sleep 1
  done
  [ "$(on_login sinfo -h -t idle -o %D)" = "$count" ] || fail "the $count Slurm nodes did not become idle"
  echo "slurm: $(on_login sinfo -h -o '%P %D %T %N')"
}
