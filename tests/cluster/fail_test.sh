#!/usr/bin/env bash
# A host's failure ends the whole job (docs/reliability.md "Across hosts"), run by CTest:
#   fail_test.sh CLUSTER_SH MOE WORKDIR cut|kill|stop RANKS_PER_HOST
# On a 2-host cluster (scripts/cluster.sh, its own name), `moe train` with checkpoints runs under the
# cluster's mpirun; once a checkpoint exists, host h1 fails:
#   cut:  its link goes down (scripts/cluster.sh cut h1),
#   kill: its moe processes get SIGKILL,
#   stop: its moe processes get SIGSTOP.
# Then: mpirun returns non-zero within 60 s of the failure; by then no process is left in any of the
# cluster's namespaces (no moe, orted or mpirun on any host or in the head); the output names host h1
# and the ranks it holds; and the last complete checkpoint, resumed on the healed cluster to the next
# checkpoint, is bit-identical (tensor bytes) to an uninterrupted run's checkpoint at that step.
# Exit 77 (skip) when the cluster cannot be made here.
# For measuring (docs/reliability.md; CTest uses the defaults): MOE_FAIL_LIVENESS (seconds, default 2),
# MOE_FAIL_KEEPALIVE=TIME,INTERVAL,PROBES (default 10,2,3; 0: no oob_tcp_keepalive_* settings), MOE_FAIL_RETRIES2=N|default (N, default 5;
# `default` leaves the kernel's 15), MOE_FAIL_LIMIT (seconds, default 60), MOE_FAIL_NAME (cluster name).
#
# Settings (say so when quoting times): collective_liveness_s 2 (a silent peer is named ~4 s after a
# collective starts waiting; the default 10 s gives ~15 s), and the two settings that let Open MPI's
# launcher notice a host it cannot reach: TCP keepalive on its out-of-band channel (MCA
# oob_tcp_keepalive_*: idle connections) and net.ipv4.tcp_retries2=5 in every namespace (a
# connection with unacknowledged data gives up after ~13 s instead of ~15 min).
set -u
CLUSTER=$1 MOE=$2 DIR=$3 KIND=$4 RPH=${5:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
NAME=${MOE_FAIL_NAME:-ft-$KIND$RPH-$$}  # its own name: two test runs on one machine do not meet
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
KEEPALIVE=${MOE_FAIL_KEEPALIVE:-10,2,3}  # time, interval, probes (Open MPI's defaults: 300, 20, 9)
IFS=, read -r ka_time ka_intvl ka_probes <<< "$KEEPALIVE"
MCA=(--mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl"
     --mca oob_tcp_keepalive_probes "$ka_probes")
[ "$KEEPALIVE" = 0 ] && MCA=()
RETRIES2=${MOE_FAIL_RETRIES2:-5} LIVENESS=${MOE_FAIL_LIVENESS:-2}
NP=$((2 * RPH)) PERIOD=20 LIMIT=${MOE_FAIL_LIMIT:-60}

die() { echo "FAIL ($KIND): $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR" || exit 1
# Clusters of earlier runs whose test process is gone (tests/cluster/owners.sh).
. "$HERE/owners.sh"
reap_orphan_clusters "$CLUSTER"
up=$("$CLUSTER" up 2 --name "$NAME" --ranks-per-host "$RPH" 2>&1)
rc=$?
[ $rc -eq 77 ] && { echo "SKIP: $up"; exit 77; }
[ $rc -eq 0 ] || { echo "$up"; die "cluster.sh up failed ($rc)"; }
trap '"$CLUSTER" down --name "$NAME" >/dev/null 2>&1' EXIT
own_cluster "$NAME"
trap "exit 124" TERM INT
WRAP=/run/moe-cluster/$NAME/mpirun
[ -x "$WRAP" ] || WRAP="$CLUSTER mpirun --name $NAME"
NSS="moe-$NAME-head moe-$NAME-h0 moe-$NAME-h1"
if [ "$RETRIES2" != default ]; then
  for ns in $NSS; do  # sysctl net.ipv4.tcp_retries2 (per network namespace), without procps
    ip netns exec "$ns" sh -c "echo $RETRIES2 > /proc/sys/net/ipv4/tcp_retries2" || die "tcp_retries2 in $ns"
  done
fi
echo "$KIND: $NP ranks on 2 hosts; collective_liveness_s $LIVENESS; MCA ${MCA[*]:-(none)}; tcp_retries2 $RETRIES2"

cat > c.yml <<'YML'
num_experts: 4
num_experts_per_tok: 2
emb_dim: 16
moe_mlp_dim: 16
dtype: f32
num_layers: 2
batch_tokens: 32
learning_rate: 0.01
warmup_steps: 2
steps: 100000
log_period: 1000
data_parallelism: -1
YML
train() {
  $WRAP "${MCA[@]}" -np $NP "$MOE" train c.yml checkpoint_period=$PERIOD collective_liveness_s=$LIVENESS "$@"
}
# "pid comm" of each process in namespace $1 (from /proc: no procps needed).
procs() { for p in $(ip netns pids "$1" 2>/dev/null); do echo "$p $(cat /proc/$p/comm 2>/dev/null)"; done; }
# The processes left in the cluster's namespaces.
left() { for ns in $NSS; do procs "$ns"; done; }
# The pids of the moe processes on host h1.
h1_ranks() { procs "moe-$NAME-h1" | awk '$2 == "moe" { print $1 }'; }
tensor_bytes() {  # the tensor data of a safetensors file (after its size and JSON header)
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((n + 9)) "$1" > "$1.data" && echo "$1.data"
}

# 1. The run, and the failure once a checkpoint exists and every rank of h1 runs.
train checkpoint_dir=ck > run.log 2>&1 &
mpirun_pid=$!
for _ in $(seq 600); do
  [ -s ck/latest ] && [ "$(h1_ranks | wc -w)" -eq "$RPH" ] && break
  kill -0 $mpirun_pid 2>/dev/null || { cat run.log; die "the run ended before the failure"; }
  sleep 0.1
done
[ -s ck/latest ] || die "no checkpoint within 60 s"
sleep 0.5
victims=$(h1_ranks | tr '\n' ' ')
t0=$(now)
case $KIND in
cut) "$CLUSTER" cut --name "$NAME" h1 > /dev/null || die "cut" ;;
kill) kill -KILL $victims ;;
stop) kill -STOP $victims ;;
*) die "unknown kind" ;;
esac
echo "$KIND: host $NAME-h1 (moe pids $victims) at step file $(cat ck/latest)"

# 2. The launcher returns non-zero within LIMIT s, and nothing of the job is left anywhere.
while kill -0 $mpirun_pid 2>/dev/null && [ "$(since "$t0" | cut -d. -f1)" -lt $LIMIT ]; do sleep 0.2; done
if kill -0 $mpirun_pid 2>/dev/null; then
  echo "mpirun still running $LIMIT s after the failure; left: $(left | tr '\n' ' ')"
  tr '\r' '\n' < run.log | grep -v '^\[' | tail -20
  kill -KILL $mpirun_pid
  die "the launcher did not return within $LIMIT s"
fi
wait $mpirun_pid
rc=$?
t_ret=$(since "$t0")
while [ -n "$(left)" ] && [ "$(since "$t0" | cut -d. -f1)" -lt $LIMIT ]; do sleep 0.2; done
t_gone=$(since "$t0")
tr '\r' '\n' < run.log | grep -E 'moe: (fatal|MPI error|rank)|mpirun noticed|lost communication|Segmentation' | sed 's/^\[[^]]*\] *[0-9/]* *loss.*ETA [0-9:]* //'
echo "$KIND: mpirun exit status $rc after $t_ret s; every process gone after $t_gone s"
[ -z "$(left)" ] || die "left $LIMIT s after the failure: $(left | tr '\n' ' ')"
[ $rc -ne 0 ] || die "mpirun exited 0"

# 3. The message names host h1 and its ranks (h1 holds ranks RPH..2*RPH-1).
ranks=$(seq -s ', ' $RPH $((NP - 1)))
[ $RPH -gt 1 ] && held="ranks $ranks" || held="rank $ranks"
if [ $KIND = kill ]; then  # mpirun's line: the first rank it saw die, with its host
  grep -Eq "process rank [$RPH-$((NP - 1))] with PID [0-9]+ on node $NAME-h1 exited on signal 9" run.log ||
    die "no line naming a rank of host $NAME-h1"
else
  grep -q "$held on host $NAME-h1 did not answer a liveness probe within [0-9.]* s (stopped, dead, or cut off); host $NAME-h1 holds $held" run.log ||
    die "no line naming host $NAME-h1 and its $held"
fi

# 4. The last complete checkpoint resumes bit-exactly on the healed cluster.
[ $KIND = cut ] && { "$CLUSTER" heal --name "$NAME" h1 > /dev/null || die "heal"; }
last=$(sed 's/.*ckpt-0*\([0-9]*\)\.safetensors/\1/' ck/latest)
next=$((last + PERIOD))
train checkpoint_dir=ck --resume ck --until $next > resume.log 2>&1 || { tail -5 resume.log; die "resume from step $last"; }
train checkpoint_dir=ref --until $next > ref.log 2>&1 || { tail -5 ref.log; die "uninterrupted run"; }
f=$(printf 'ckpt-%08d.safetensors' $next)
cmp -s "$(tensor_bytes ck/$f)" "$(tensor_bytes ref/$f)" || die "resumed checkpoint $f differs from the uninterrupted run's"
echo "$KIND: the last complete checkpoint (step $last) resumed to step $next: bit-identical to the uninterrupted run"
echo "$KIND: OK"
