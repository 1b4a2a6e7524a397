#!/usr/bin/env bash
# A cluster of N "hosts" on this machine, for running the engine across hosts with MPI over TCP
# (docs/distributed.md "Across hosts"). Each host is a network namespace with its own hostname (a
# UTS namespace), its own address on a bridge and a link shaped with tc; Open MPI starts its daemons
# in the hosts through an rsh agent that enters the namespaces (no sshd). Needs root.
#
#   scripts/cluster.sh up N [--name NAME] [--ranks-per-host R] [--link RATE[,DELAY]] [--cpus MODE]
#                           [--slurm]
#   scripts/cluster.sh mpirun [--name NAME] MPIRUN_ARGS...   # or the wrapper `up` prints
#   scripts/cluster.sh srun|sbatch|sinfo [--name NAME] ARGS... # with --slurm
#   scripts/cluster.sh exec [--name NAME] HOST CMD...        # a command on one host
#   scripts/cluster.sh placement [--name NAME] NP [ARGS...]  # where NP ranks run (host, cpus); fails
#                                                            # if a rank is off its host's cpus
#   scripts/cluster.sh status [--name NAME]                  # hosts, links, bytes through each link
#   scripts/cluster.sh down [--name NAME | --all]            # idempotent; also after a crash
#   scripts/cluster.sh cut [--name NAME] HOST                # HOST's link down (a pulled cable)
#   scripts/cluster.sh heal [--name NAME] HOST               # HOST's link up again
#
# NAME (default: $MOE_CLUSTER, else "moe") keeps clusters apart: namespaces moe-NAME-head and
# moe-NAME-h0..h{N-1}, hostnames NAME-h0..., state in /run/moe-cluster/NAME. Every cluster has its own
# bridge inside its own head namespace, so clusters never see each other's traffic and all use the
# subnet 10.77.0.0/24 (host i is 10.77.0.(i+1), the head 10.77.0.254). mpirun runs in the head.
#
# --link RATE[,DELAY]: tc rate (e.g. 1gbit, 100mbit) as a tbf on both ends of every host's link
#   (bucket 0.1 ms at the rate, at least 16 KiB: every message sees the rate, not only long streams),
#   and DELAY (e.g. 1ms) as a netem on the host's sending side (one-way host-to-host delay = DELAY).
#   Where the kernel has no sch_netem the delay is not applied, and `up` says so.
# --cpus auto|split|shared: split gives host i its own share of the cores (taskset on the host's
#   daemon, inherited by its ranks); shared runs every host on all cores. auto (default) splits when
#   the cores are at least the hosts, else shares. What was done is printed.
# --slurm: also a private Slurm (munged + slurmctld in the head, slurmd in each host; scripts/
#   cluster_slurm.sh), with srun/sbatch/sinfo wrappers in the state dir.
#
# Exit status of `up`: 0 up; 77 namespaces cannot be made here (not root, no `ip`...: the reason is
# printed; tests skip on it); 1 any other error.
set -Eeuo pipefail

STATE_ROOT=${MOE_CLUSTER_STATE:-/run/moe-cluster}
. "$(dirname "$0")/cluster_slurm.sh"
SUBNET=10.77.0
SKIP=77

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: cannot make a cluster here: $*" >&2; exit $SKIP; }

usage() {
  sed -n "7,17p" "$0" | sed 's/^# //' >&2
  exit 1
}

# Sets NAME from --name (consumed from the arguments in ARGS) or the environment.
parse_name() {
  NAME=${MOE_CLUSTER:-moe}
  ARGS=()
  while (($#)); do
    case $1 in
    --name) (($# >= 2)) || die "--name needs a value"; NAME=$2; shift 2 ;;
    --name=*) NAME=${1#--name=}; shift ;;
    *) ARGS+=("$1"); shift ;;
    esac
  done
  [[ $NAME =~ ^[a-z0-9][a-z0-9-]{0,19}$ ]] ||
    die "--name '$NAME': expected 1-20 characters of a-z, 0-9 and '-', starting with a letter or digit"
  DIR=$STATE_ROOT/$NAME
}

ns_of() { echo "moe-$NAME-$1"; }  # the netns of host h0.., or of the head

# Expands a cpu list like 0-3,6 into one id per line.
expand_cpus() {
  local part
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

# RATE like 100mbit / 1gbit / 500kbit / 1000000bit -> bits per second.
rate_bits() {
  [[ $1 =~ ^([0-9]+)([kmgt]?)(bit)?$ ]] || die "--link rate '$1': expected a number with kbit, mbit or gbit (e.g. 1gbit)"
  local n=${BASH_REMATCH[1]} mult=1
  case ${BASH_REMATCH[2]} in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;; esac
  echo $((n * mult))
}

preflight() {
  [ "$(id -u)" -eq 0 ] || skip "not root (network and UTS namespaces need root)"
  local c
  for c in ip tc unshare nsenter taskset mpirun; do
    command -v $c >/dev/null || skip "no '$c' command (scripts/install_deps.sh installs iproute2, util-linux and openmpi-bin)"
  done
  ip netns add "moe-$NAME-probe" 2>/tmp/moe-cluster-probe.$$ || {
    local why; why=$(cat /tmp/moe-cluster-probe.$$); rm -f /tmp/moe-cluster-probe.$$
    skip "'ip netns add' failed: $why"
  }
  rm -f /tmp/moe-cluster-probe.$$
  ip netns del "moe-$NAME-probe"
}

# Makes a persistent UTS namespace bound on FILE with hostname HOST.
make_uts() {
  touch "$1"
  unshare --uts="$1" hostname "$2" || die "could not make a UTS namespace at $1"
}

# Shapes device DEV in netns NS: netem DELAY (if given and available), then below it tbf RATE (if
# given). The netem path is not exercised on the machine this was written on (no sch_netem there).
shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4 bits burst parent=root
  if [ -n "$delay" ] && [ "$NETEM" = yes ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000
    parent="parent 1:1 handle 2:"
  fi
  [ -n "$rate" ] || return 0
  bits=$(rate_bits "$rate")
  # The bucket: what may leave at the veth's own speed after an idle spell. A real link has none,
  # so it is kept small: 0.1 ms at the rate, at least 16 KiB (tbf cuts a larger GSO packet into
  # segments; 4 KiB worked too). Until 2026-12-02 it was 10 ms at the rate (at least 128 KiB): at
  # 400mbit that let a 500 KB burst through unshaped, so a step's per-chunk messages (128 KB,
  # separated by compute that refilled the bucket) crossed at veth speed and only long streams
  # saw the rate (docs/distributed.md, "Across 2 hosts x 1 rank"). MOE_CLUSTER_BURST=BYTES overrides.
  burst=$((bits / 8 / 10000))
  ((burst >= 16384)) || burst=16384
  [ -z "${MOE_CLUSTER_BURST:-}" ] || burst=$MOE_CLUSTER_BURST
  ip netns exec "$ns" tc qdisc add dev "$dev" $parent tbf rate "$rate" burst "$burst" latency 100ms
}

# Decides whether netem exists (NETEM=yes|no) with a throwaway veth pair in the head.
probe_netem() {
  NETEM=no
  ip -n "$(ns_of head)" link add nprobe0 type veth peer name nprobe1
  ip netns exec "$(ns_of head)" tc qdisc add dev nprobe0 root netem delay 1ms 2>/dev/null && NETEM=yes
  ip -n "$(ns_of head)" link del nprobe0
}

# Writes the rsh agent and the mpirun wrapper into $DIR.
write_scripts() {
  cat > "$DIR/agent" <<EOF
#!/usr/bin/env bash
# Open MPI's plm_rsh_agent for cluster '$NAME': \`agent [options] HOST COMMAND...\` runs COMMAND
# (shell syntax, as ssh would) in HOST's network and UTS namespaces, on its cpus.
while [[ \${1:-} == -* ]]; do shift; done
host=\${1:?agent: no host}; shift
line=\$(grep "^\$host " "$DIR/hosts") || { echo "agent: '\$host' is not a host of cluster $NAME" >&2; exit 255; }
read -r _ ns uts _ cpus <<< "\$line"
pin=(); [ "\$cpus" = all ] || pin=(taskset -c "\$cpus")
exec nsenter --net=/run/netns/\$ns --uts="\$uts" -- "\${pin[@]}" /bin/sh -c "\$*"
EOF
  cat > "$DIR/mpirun" <<EOF
#!/bin/sh
# mpirun on cluster '$NAME' (scripts/cluster.sh): runs in the head namespace; daemons start in the
# hosts through the agent; TCP between hosts on the bridge ($SUBNET.0/24), shared memory within a
# host (each host has its own hostname); ranks yield when idle (else veth traffic waits for the
# next scheduler tick, 4 ms a message, on a busy machine); every TCP connection is made in MPI_Init
# (made lazily, 3 of 8 \`moe check\` runs on 2x2 failed to connect, each in a side-engine variant:
# docs/distributed.md "Across hosts"); --bind-to none: each rank keeps its host's CPU set, which
# the agent gave its daemon (Open MPI's default binding resets it: with 2 ranks or fewer to a core
# of the whole machine, the same core on every host; with more, to every core).
exec nsenter --net=/run/netns/$(ns_of head) --uts="$DIR/uts/head" -- $(command -v mpirun) \\
  --hostfile "$DIR/hostfile" --mca plm_rsh_agent "$DIR/agent" --mca plm_rsh_no_tree_spawn 1 \\
  --mca btl self,vader,tcp --mca btl_tcp_if_include $SUBNET.0/24 --mca oob_tcp_if_include $SUBNET.0/24 \\
  --mca mpi_yield_when_idle 1 --mca mpi_preconnect_mpi 1 --bind-to none "\$@"
EOF
  chmod +x "$DIR/agent" "$DIR/mpirun"
}

cmd_up() {
  local n=${1:-} rph=1 link="" cpus=auto slurm=no
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "up: expected the number of hosts (1-200), got '${n}'"
  shift
  while (($#)); do
    case $1 in
    --ranks-per-host) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-host: expected a positive integer"; rph=$2; shift 2 ;;
    --link) [ -n "${2:-}" ] || die "--link: expected RATE[,DELAY]"; link=$2; shift 2 ;;
    --cpus) [[ ${2:-} =~ ^(auto|split|shared)$ ]] || die "--cpus: expected auto, split or shared"; cpus=$2; shift 2 ;;
    --slurm) slurm=yes; shift ;;
    *) die "up: unknown option '$1'" ;;
    esac
  done
  local rate=${link%%,*} delay=""
  [[ $link == *,* ]] && delay=${link#*,}
  [ -z "$rate" ] || rate_bits "$rate" >/dev/null
  [ -z "$delay" ] || [[ $delay =~ ^[0-9.]+(us|ms|s)$ ]] || die "--link delay '$delay': expected e.g. 500us or 2ms"
  preflight
  [ ! -e "$DIR" ] && ! ip netns list | grep -q "^moe-$NAME-" ||
    die "cluster '$NAME' exists (state $DIR): run 'scripts/cluster.sh down --name $NAME' first"
  mkdir -p "$DIR/uts"
  trap 'echo "cluster.sh: up failed; cleaning up" >&2; cmd_down >/dev/null 2>&1' ERR

  # CPU sets: the allowed cpus of this process, cut into N equal shares, or shared.
  local all per
  mapfile -t all < <(expand_cpus "$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)")
  if [ "$cpus" = auto ]; then
    if ((${#all[@]} >= n)); then cpus="split"; else cpus="shared"; fi
  fi
  ((${#all[@]} >= n)) || [ "$cpus" = shared ] || die "--cpus split: ${#all[@]} cores for $n hosts"
  per=$((${#all[@]} / n))

  local head; head=$(ns_of head)
  ip netns add "$head"
  make_uts "$DIR/uts/head" "$NAME-head"
  ip -n "$head" link set lo up
  ip -n "$head" link add br0 type bridge
  ip -n "$head" addr add $SUBNET.254/24 dev br0
  ip -n "$head" link set br0 up
  [ -z "$delay" ] || probe_netem
  : > "$DIR/hosts"; : > "$DIR/hostfile"
  local i ns host set
  for ((i = 0; i < n; i++)); do
    ns=$(ns_of h$i) host=$NAME-h$i
    ip netns add "$ns"
    make_uts "$DIR/uts/h$i" "$host"
    ip -n "$head" link add h$i type veth peer name eth0 netns "$ns"
    ip -n "$head" link set h$i master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add $SUBNET.$((i + 1))/24 dev eth0
    ip -n "$ns" link set eth0 up
    [ -z "$link" ] || shape "$ns" eth0 "$rate" "$delay"
    [ -z "$rate" ] || shape "$head" h$i "$rate" ""
    set=all
    [ $cpus = split ] && set=$(IFS=,; echo "${all[*]:$((i * per)):$per}")
    echo "$host $ns $DIR/uts/h$i $SUBNET.$((i + 1)) $set" >> "$DIR/hosts"
    echo "$host slots=$rph" >> "$DIR/hostfile"
  done
  write_scripts
  [ $slurm = no ] || slurm_up "$n" "$rph"
  trap - ERR
  echo "$n $rph ${link:-none} $cpus ${NETEM:-}" > "$DIR/config"

  echo "cluster '$NAME' up: $n host(s) x $rph rank(s), bridge $SUBNET.0/24 (head $SUBNET.254, state $DIR)"
  if [ -z "$link" ]; then
    echo "link: not shaped (veth at memory speed)"
  else
    [ -z "$rate" ] || echo "link: rate $rate each way on every host's link (tbf)"
    if [ -n "$delay" ] && [ "$NETEM" = yes ]; then echo "link: delay $delay on every host's sending side (netem)"
    elif [ -n "$delay" ]; then
      echo "link: delay $delay NOT applied: this kernel has no sch_netem (tc netem fails)${rate:+; only the rate is shaped}"
    fi
  fi
  if [ $cpus = split ]; then
    echo "cpus: ${#all[@]} core(s) for $n host(s): each host runs on its own $per core(s) (taskset), listed below"
  else
    echo "cpus: ${#all[@]} core(s) for $n host(s): the hosts share all cores (no per-host cpu set)"
  fi
  echo "hosts (name netns uts address cpus):"; sed 's/^/  /' "$DIR/hosts"
  echo "hostfile: $DIR/hostfile"; sed 's/^/  /' "$DIR/hostfile"
  echo "mpirun wrapper: $DIR/mpirun   e.g. $DIR/mpirun -np $((n * rph)) hostname"
  [ $slurm = no ] || echo "slurm: $n node(s) idle; wrappers $DIR/srun, $DIR/sbatch, $DIR/sinfo   e.g. $DIR/srun -N $n -n $((n * rph)) --mpi=pmix hostname"
}

cmd_down() {
  local ns pid m
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^moe-$NAME-\(head\|h[0-9]*\|probe\)$"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -d "$DIR" ]; then
    for m in "$DIR"/uts/*; do
      [ -e "$m" ] || continue
      umount "$m" 2>/dev/null || true
    done
    rm -rf "$DIR"
  fi
  echo "cluster '$NAME' down"
}

cmd_status() {
  [ -f "$DIR/hosts" ] || { echo "cluster '$NAME' is not up (no $DIR/hosts)"; return 1; }
  local n rph link cpus
  read -r n rph link cpus _ < "$DIR/config"
  echo "cluster '$NAME': $n host(s) x $rph rank(s), link $link, cpus $cpus; wrapper $DIR/mpirun"
  printf '%-20s %-20s %-10s %-8s %14s %14s  %s\n' host hostname address cpus tx_bytes rx_bytes qdisc
  local host ns uts addr set hn tx rx q
  while read -r host ns uts addr set; do
    hn=$(nsenter --uts="$uts" hostname 2>/dev/null || echo "?")
    tx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null || echo "?")
    rx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null || echo "?")
    q=$(ip netns exec "$ns" tc qdisc show dev eth0 2>/dev/null | awk '{print $2}' | paste -sd+ -)
    printf '%-20s %-20s %-10s %-8s %14s %14s  %s\n' "$host" "$hn" "$addr" "$set" "$tx" "$rx" "$q"
  done < "$DIR/hosts"
}

cmd_exec() {
  [ -x "$DIR/agent" ] || die "cluster '$NAME' is not up (no $DIR/agent)"
  (($# >= 2)) || die "exec: expected HOST COMMAND..."
  local host=$1; shift
  [[ $host == h[0-9]* ]] && host=$NAME-$host
  local line; line=$(grep "^$host " "$DIR/hosts") || die "exec: '$host' is not a host of cluster '$NAME'"
  local _ ns uts set pin=()
  read -r _ ns uts _ set <<< "$line"
  [ "$set" = all ] || pin=(taskset -c "$set")
  exec nsenter --net=/run/netns/"$ns" --uts="$uts" -- "${pin[@]}" "$@"
}

# placement NP [MPIRUN_ARGS...]: NP ranks under the cluster's mpirun print their host and cpus, one
# line per rank; status 1 if a rank runs on cpus other than its host's set (`all`: every cpu here).
cmd_placement() {
  [ -x "$DIR/mpirun" ] || die "cluster '$NAME' is not up (no $DIR/mpirun)"
  [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || die "placement: expected the number of ranks, got '${1:-}'"
  local np=$1 out r host cpus want bad=0
  shift
  out=$("$DIR/mpirun" -np "$np" "$@" sh -c \
    'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(sed -n "s/^Cpus_allowed_list:\s*//p" /proc/self/status)"') ||
    die "placement: mpirun failed: $out"
  while read -r r host cpus; do
    want=$(awk -v h="$host" '$1 == h { print $5 }' "$DIR/hosts")
    [ "$want" = all ] && want=$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)
    if [ "$(expand_cpus "$cpus" | sort -n)" = "$(expand_cpus "$want" | sort -n)" ]; then
      echo "rank $r: host $host, cpus $cpus"
    else
      echo "rank $r: host $host, cpus $cpus: NOT its host's cpus ($want)"
      bad=1
    fi
  done < <(sort -n <<<"$out")
  return $bad
}

# cut / heal HOST: the host's veth end in the head (its switch port) down / up; the host's eth0
# loses its carrier, so nothing passes either way and no TCP peer sees a reset (a pulled cable).
cmd_link() {
  local state=$1; shift
  [ -f "$DIR/hosts" ] || die "cluster '$NAME' is not up (no $DIR/hosts)"
  (($# == 1)) || die "$([ $state = down ] && echo cut || echo heal): expected one HOST (h1 or $NAME-h1)"
  local host=$1
  [[ $host == h[0-9]* ]] && host=$NAME-$host
  grep -q "^$host " "$DIR/hosts" || die "'$1' is not a host of cluster '$NAME'"
  ip -n "$(ns_of head)" link set "${host#"$NAME"-}" $state
  echo "cluster '$NAME': $host link $state"
}

(($#)) || usage
sub=$1; shift
case $sub in
up) parse_name "$@"; cmd_up "${ARGS[@]}" ;;
down)
  if [ "${1:-}" = --all ]; then
    for d in $(ip netns list 2>/dev/null | sed -n 's/^moe-\([a-z0-9-]*\)-head.*/\1/p'; ls "$STATE_ROOT" 2>/dev/null); do
      NAME=$d DIR=$STATE_ROOT/$d cmd_down
    done
  else
    parse_name "$@"; ((${#ARGS[@]} == 0)) || die "down: unexpected '${ARGS[0]}'"; cmd_down
  fi
  ;;
status) parse_name "$@"; cmd_status ;;
placement)
  # --name is read only as the first argument here, so that mpirun's own arguments pass untouched.
  NAME=${MOE_CLUSTER:-moe}
  if [ "${1:-}" = --name ]; then NAME=$2; shift 2; fi
  parse_name --name "$NAME"
  cmd_placement "$@"
  ;;
cut) parse_name "$@"; cmd_link down "${ARGS[@]}" ;;
heal) parse_name "$@"; cmd_link up "${ARGS[@]}" ;;
mpirun)
  # --name is read only as the first argument here, so that mpirun's own arguments pass untouched.
  NAME=${MOE_CLUSTER:-moe}
  if [ "${1:-}" = --name ]; then NAME=$2; shift 2; fi
  parse_name --name "$NAME"
  [ -x "$DIR/mpirun" ] || die "cluster '$NAME' is not up (no $DIR/mpirun)"
  exec "$DIR/mpirun" "$@"
  ;;
srun | sbatch | sinfo | squeue | scancel)
  NAME=${MOE_CLUSTER:-moe}
  if [ "${1:-}" = --name ]; then NAME=$2; shift 2; fi
  parse_name --name "$NAME"
  [ -x "$DIR/$sub" ] || die "cluster '$NAME' has no Slurm (up ... --slurm)"
  exec "$DIR/$sub" "$@"
  ;;
exec)
  NAME=${MOE_CLUSTER:-moe}
  if [ "${1:-}" = --name ]; then NAME=$2; shift 2; fi
  parse_name --name "$NAME"
  cmd_exec "$@"
  ;;
*) usage ;;
esac
