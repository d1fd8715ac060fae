# The slurm.conf of the tests' private Slurm clusters (tests/e2e/slurm_*.sh), sourced.
#   write_slurm_conf FILE CLUSTER CONTROLLER NODE_LINE DIR NODE_DIR [LINE...]
# CONTROLLER is SlurmctldHost's value, NODE_LINE the NodeName line, DIR the cluster's own files
# (state, controller pid and log, the munge socket), NODE_DIR each slurmd's (spool, pid, log;
# "$DIR/%n" when several hosts share the file system); further LINEs are added as given.
write_slurm_conf() {
  local file=$1 cluster=$2 controller=$3 node_line=$4 dir=$5 node_dir=$6
  shift 6
  {
    echo "ClusterName=$cluster"
    echo "SlurmctldHost=$controller"
    [ $# -eq 0 ] || printf '%s\n' "$@"
    cat <<EOF
SlurmUser=root
AuthType=auth/munge
# A requeued job waits for the old credential to expire: 5 s instead of 120.
AuthInfo=socket=$dir/munge.sock,cred_expire=5
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdSpoolDir=$node_dir/spool
SlurmdPidFile=$node_dir/slurmd.pid
SlurmdLogFile=$node_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=10
MinJobAge=600
$node_line
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  } >"$file"
}
