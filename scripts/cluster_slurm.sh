# shellcheck shell=bash
# Sourced by scripts/cluster.sh for `up ... --slurm`: a private Slurm on the cluster, for trying srun
# and batch scripts (scripts/slurm_train.sbatch) without a real cluster. Everything lives in the
# cluster's namespaces and state dir, so `down` ends it with the rest:
#   head: munged (its own key and socket in $DIR/slurm) and slurmctld (port 6817 on 10.77.0.254)
#   host i: slurmd -N NAME-hi (NodeAddr 10.77.0.(i+1), CPUs = ranks per host), in a mount namespace
#     of its own where $DIR/slurm/tmp is the host's own directory: the hosts share this machine's
#     file system, and Slurm's PMIx plugin keeps per-step files under TmpFS, which would collide.
# Wrappers $DIR/srun, $DIR/sbatch, $DIR/sinfo run the client in the head with SLURM_CONF set and the
# same Open MPI settings as the mpirun wrapper (TCP on the bridge, yield when idle, preconnect) in the
# environment, which srun passes on to the tasks.

slurm_write_conf() {  # slurm_write_conf N RANKS_PER_HOST
  local s=$DIR/slurm i
  cat > "$s/slurm.conf" << EOF
# Written by scripts/cluster.sh up --slurm for cluster '$NAME'.
ClusterName=$NAME
SlurmctldHost=$NAME-head($SUBNET.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$s/munge.sock
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool/%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd-%n.log
TmpFS=$s/tmp/node
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
EOF
  for ((i = 0; i < $1; i++)); do
    echo "NodeName=$NAME-h$i NodeAddr=$SUBNET.$((i + 1)) CPUs=$2 State=UNKNOWN" >> "$s/slurm.conf"
  done
  echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$s/slurm.conf"
}

slurm_write_wrappers() {
  local tool
  for tool in srun sbatch sinfo squeue scancel; do
    cat > "$DIR/$tool" << EOF
#!/bin/sh
# $tool on cluster '$NAME' (scripts/cluster.sh up --slurm).
export SLURM_CONF="$DIR/slurm/slurm.conf" OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24 OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24 OMPI_MCA_mpi_preconnect_mpi=1
exec nsenter --net=/run/netns/$(ns_of head) --uts="$DIR/uts/head" -- $tool "\$@"
EOF
    chmod +x "$DIR/$tool"
  done
}

slurm_up() {  # slurm_up N RANKS_PER_HOST
  local s=$DIR/slurm i ns uts set pin
  for i in slurmctld slurmd srun munged mungekey; do
    command -v $i > /dev/null || die "--slurm: no '$i' (scripts/install_deps.sh installs slurmctld, slurmd, slurm-client and munge)"
  done
  mkdir -p "$s/state" "$s/log" "$s/key" "$s/tmp/node"
  chmod 700 "$s/key"
  mungekey --create --keyfile="$s/key/munge.key"
  slurm_write_conf "$1" "$2"
  slurm_write_wrappers
  local head=(nsenter --net=/run/netns/"$(ns_of head)" --uts="$DIR/uts/head" --)
  "${head[@]}" munged --force --socket="$s/munge.sock" --key-file="$s/key/munge.key" \
    --origin=$SUBNET.254 --log-file="$s/log/munged.log" --pid-file="$s/munged.pid" --seed-file="$s/key/munged.seed"
  SLURM_CONF=$s/slurm.conf "${head[@]}" slurmctld -i
  for ((i = 0; i < $1; i++)); do
    mkdir -p "$s/spool/$NAME-h$i" "$s/tmp/h$i"
    read -r _ ns uts _ set < <(sed -n "$((i + 1))p" "$DIR/hosts")
    pin=()
    [ "$set" = all ] || pin=(taskset -c "$set")
    SLURM_CONF=$s/slurm.conf nsenter --net=/run/netns/"$ns" --uts="$uts" -- "${pin[@]}" \
      unshare --mount --propagation private sh -c \
      "mount --bind '$s/tmp/h$i' '$s/tmp/node' && exec slurmd -N '$NAME-h$i'"
  done
  for ((i = 0; i < 60; i++)); do
    [ "$("$DIR/sinfo" -h -o %D -t idle 2> /dev/null)" = "$1" ] && return 0
    sleep 0.5
  done
  die "--slurm: the nodes did not come up within 30 s: $("$DIR/sinfo" 2>&1); logs in $s/log"
}
