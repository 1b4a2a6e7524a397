#!/usr/bin/env bash
# The engine across hosts: CTest's cluster_* tests on scripts/cluster.sh (docs/distributed.md
# "Across hosts").
#   cluster_test.sh MODE BUILD_DIR WORK_DIR
# MODE:
#   harness          up/status/exec/down of the harness itself: hostnames, addresses, the link's qdiscs,
#                    errors, down after a crash (a process left in a host), down twice, not root -> 77
#   mpi_2x2 mpi_4x1  the MPI layer tests (the whole moe_mpi_tests binary) on 2 hosts x 2 ranks / 4 x 1
#   check_2x2 check_4x1  `moe check`, every variant
#   train            `moe train` with checkpoints: straight runs on 2x2 and 4x1 are bit-identical;
#                    a step-3 checkpoint resumes bit-exactly on its own layout and on the other one
#   plan             `moe plan --calibrate` across 2 hosts x 1 rank at a shaped link (1gbit): the
#                    network stack's CPU per byte is measured (every rank on a host of its own) and
#                    written to the rates file; on 2 x 2 (ranks sharing a host) it is left as it was
#   srun             a private Slurm on 2x2 (up --slurm): srun --mpi=pmix places ranks and runs
#                    `moe check`; scripts/slurm_train.sbatch (sbatch, stopped at step 3, re-submitted:
#                    resumes) ends bit-identical to `moe train` under the cluster's mpirun
# Every MPI mode first checks that each rank runs on the host the hostfile puts it on (hostnames equal
# within a host, different across), and after the run that every host's link carried traffic (so
# the ranks of different hosts talked over TCP, not shared memory).
# Exit 77 (CTest SKIP) with the reason when namespaces cannot be made here (not root, no `ip`).
set -u
MODE=$1 BUILD=$(cd "$2" && pwd) WORK=$3
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=$SRC/scripts/cluster.sh
MOE=$BUILD/moe
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NAMES=()

die() { echo "FAIL: $*"; exit 1; }
cleanup() { local n; for n in "${NAMES[@]}"; do "$CLUSTER" down --name "$n" > /dev/null 2>&1; done; }
trap cleanup EXIT
trap 'exit 1' INT TERM

# Clusters of earlier runs whose test process is gone (tests/cluster/owners.sh).
. "$SRC/tests/cluster/owners.sh"
reap_orphan_clusters "$CLUSTER"

# up NAME_TAG HOSTS RANKS_PER_HOST [options]: brings up cluster ct<tag>-<pid>; sets C to its state dir
# and UP_OUT to what `up` printed.
up() {
  local name=ct$1-$$ out rc
  UP_OUT=$("$CLUSTER" up "$2" --name "$name" --ranks-per-host "$3" "${@:4}" 2>&1)
  rc=$?
  echo "$UP_OUT"
  [ $rc -eq 77 ] && { echo "SKIP: $(echo "$UP_OUT" | tail -1)"; exit 77; }
  [ $rc -eq 0 ] || die "cluster.sh up $name failed (status $rc)"
  NAMES+=("$name")
  C=/run/moe-cluster/$name
  own_cluster "$name"
}

# A cpu list (0-2,5 or 0,1,2,5) as one id per line.
cpu_ids() {
  local part
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

# Every rank's hostname is the one its slot in the hostfile names (rank r on host r / R), and it
# runs on its host's CPU set (the hosts file's last field; "all": every core this test may use).
check_placement() {
  local c=$1 n=$2 rph=$3 out r host want cpus wcpus
  out=$(timeout 60 "$c/mpirun" -np $((n * rph)) sh -c \
    'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(sed -n "s/^Cpus_allowed_list:\s*//p" /proc/self/status)"' 2>&1) ||
    die "mpirun hostname on $c: $out"
  for ((r = 0; r < n * rph; r++)); do
    read -r host cpus <<<"$(echo "$out" | awk -v r=$r '$1 == r { print $2, $3 }')"
    want=${c##*/}-h$((r / rph))
    [ "$host" = "$want" ] || die "rank $r runs on host '$host', expected '$want'"
    wcpus=$(awk -v h="$want" '$1 == h { print $5 }' "$c/hosts")
    [ "$wcpus" = all ] && wcpus=$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)
    [ "$(cpu_ids "$cpus")" = "$(cpu_ids "$wcpus")" ] || die "rank $r on $host runs on cpus '$cpus', expected its host's '$wcpus'"
  done
  echo "placement: $((n * rph)) ranks, $rph per host, hostnames equal within a host and different across ($n hosts); each on its host's cpus"
}

# Bytes through host links (tx + rx of each host's eth0), one line per host.
link_bytes() {
  local host ns rest
  while read -r host ns rest; do
    echo $(($(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes) +
      $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)))
  done < "$1/hosts"
}

# Every host's link carried at least MIN bytes between the two readings.
check_traffic() {
  local before=$1 after=$2 min=$3 i=0 b a
  paste <(echo "$before") <(echo "$after") | while read -r b a; do
    echo "host h$i link: $((a - b)) bytes (tx+rx)"
    (((a - b) >= min)) || { echo "FAIL: host h$i's link carried $((a - b)) bytes, expected >= $min: no TCP between hosts?"; exit 1; }
    i=$((i + 1))
  done || exit 1
}

# run_on C N RPH MIN_BYTES CMD...: placement check, CMD under the cluster's mpirun, traffic check.
run_on() {
  local c=$1 n=$2 rph=$3 min=$4 before
  shift 4
  check_placement "$c" "$n" "$rph"
  before=$(link_bytes "$c")
  timeout 240 "$c/mpirun" -np $((n * rph)) "$@" || die "$* on ${c##*/} ($n hosts x $rph) failed (status $?)"
  check_traffic "$before" "$(link_bytes "$c")" "$min"
}

layout() { N=${1%x*} RPH=${1#*x}; }

# The small `moe train` job of the train and srun modes: 4 ranks as fsdp 2 x expert 2, 6 steps.
write_train_config() {
  cat > c.yml << 'YML'
num_experts: 4
num_experts_per_tok: 2
emb_dim: 16
moe_mlp_dim: 16
dtype: f32
num_layers: 2
batch_tokens: 32
learning_rate: 0.01
warmup_steps: 2
steps: 6
log_period: 1
fsdp_parallelism: 2
expert_parallelism: 2
YML
}
# The tensor data of a safetensors file (after its 8-byte size and JSON header, whose metadata names
# the checkpoint directory).
tensor_bytes() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((n + 9)) "$1" > "$1.data" && echo "$1.data"
}

rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
case $MODE in
harness) . "$SRC/tests/cluster/harness_checks.sh" ;;
mpi_*)
  layout "${MODE#mpi_}"
  up "m${MODE#mpi_}" $N $RPH
  run_on "$C" $N $RPH 100000 "$BUILD/moe_mpi_tests" --gtest_brief=1
  ;;
check_*)
  layout "${MODE#check_}"
  up "c${MODE#check_}" $N $RPH
  run_on "$C" $N $RPH 100000 "$MOE" check --json check.json
  grep -q '"variants"' check.json || die "no variants in check.json"
  ;;
plan)
  "$MOE" plan --calibrate --tiny --out rates.json > np1.log || die "moe plan --calibrate (one process) failed"
  grep -q '"comm_cpu_ns_per_byte": 1.3' rates.json || die "the one-process rates do not hold the default 1.3 ns per byte"
  up p1x 2 1 --link 1gbit
  run_on "$C" 2 1 100000 "$MOE" plan --calibrate --tiny --rates "$PWD/rates.json" --out "$PWD/rates_1x.json" > np2.log
  cat np2.log
  grep -Eq "network stack CPU: [0-9.]+ ns per byte sent between hosts \(measured by this run" np2.log ||
    die "2 hosts x 1 rank: the network stack's CPU was not measured"
  ns=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["comm_cpu_ns_per_byte"])' rates_1x.json)
  python3 -c "import sys; sys.exit(0 if 0 < $ns < 1000 and $ns != 1.3 else 1)" ||
    die "2 hosts x 1 rank: comm_cpu_ns_per_byte $ns in the rates file, expected the measured value"
  echo "measured across 2 hosts at 1gbit: $ns ns per byte"
  up p2x 2 2
  run_on "$C" 2 2 100000 "$MOE" plan --calibrate --tiny --rates "$PWD/rates.json" --out "$PWD/rates_2x.json" > np4.log
  grep -q "this run did not measure it" np4.log || { cat np4.log; die "2 hosts x 2 ranks: expected no measurement"; }
  grep -q '"comm_cpu_ns_per_byte": 1.3' rates_2x.json || die "2 hosts x 2 ranks changed comm_cpu_ns_per_byte"
  ;;
train) . "$SRC/tests/cluster/train_checks.sh" ;;
srun) . "$SRC/tests/cluster/srun_checks.sh" ;;
*) die "unknown mode $MODE" ;;
esac
echo PASS
