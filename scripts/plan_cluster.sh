#!/bin/bash
# moe plan across hosts: 2 hosts x 2 ranks of the cluster-on-one-machine harness (scripts/cluster.sh;
# CLUSTER_DIR: a checkout with it, default this one) at each link rate given; per rate: the link's
# α measured with 1 rank per host (moe plan --calibrate under mpirun -np 2 --map-by node), its
# bandwidth for one stream per pair of hosts with both ranks of each host streaming (`moe bench
# --dist --probe-pattern pairs`, -np 4 --map-by node: inter_bw; rounds measured before it: the
# one-rank-per-host calibration's β), the NIC's bandwidth for the all-to-all
# with the run's placement (4 MB per rank in A2A_CALLS all-to-alls of the 4 ranks, `moe bench --dist --probe-mb 4`:
# each rank sends to both ranks of the other host at once; solved for β_inter with the model's flat
# all-to-all formula, the intra-host part at the rates file's shared memory: inter_a2a_bw),
# the contention of the run's own placement (2 ranks on each host's one core, peers across the
# link) measured under the cluster's mpirun -np 4 into OUT_DIR/rates_cluster_RATE.json, the
# `moe bench --dist` variants measured, then predicted with the measured link and that contention
# row (no `sync` on top: the row's wait after compute already holds the wait for the slowest peer
# across the link). Needs root and the single-process rates of scripts/plan_validate.sh
# (OUT_DIR/rates.json).
# Usage: [VARIANTS="v1 v2"] scripts/plan_cluster.sh OUT_DIR RATE... (e.g. out/plan 1gbit 200mbit);
# a rate already measured (OUT_DIR/m_cluster_RATE.json) with SKIP_MEASURED=1 is only predicted.
# The link probes (`moe bench --dist --probe-mb`) time two passes, MPI's own waits and polite ones;
# the link's time is the faster of the two medians (probe_s; LINK_PASS=spinning: the first, as
# before 2026-12-05): the spinning pass's ranks, 2 to a core, stand in the way of the kernel's packet
# processing, and its median moved 0-22% above the polite one's from round to round.
# RATE `unshaped`: no tc on the links (veth at full speed).
# RPH=1: item 5's layout and run settings instead (docs/benchmarks.md "Overlap across hosts"): 2
# hosts x 1 rank, one core each, the 2-rank variants, real-time side-engine workers, TCP tuned. One calibration under the cluster's mpirun -np 2 (one rank per
# host) gives the link's α and β (one TCP stream: the rank is its host's only sender), the network
# stack's CPU per byte (comm_cpu_ns_per_byte: every rank on a host of its own) and the contention
# row of 1 rank per core with the peer across the link; files OUT_DIR/*_1x_RATE*.
# HOSTS=4 (with RPH=1): 4 hosts x 1 rank sharing the machine's cores, the 4-rank variants; the link's
# α from 2 of the hosts, its bandwidths from probes with every host sending (pairs: inter_bw; the
# all-to-all: inter_a2a_bw); files OUT_DIR/*_4x1_RATE*.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1
shift
CLUSTER_DIR=${CLUSTER_DIR:-$PWD}
C="$CLUSTER_DIR/scripts/cluster.sh"
MOE=$PWD/build/moe
RPH=${RPH:-2}
HOSTS=${HOSTS:-2}
[[ $RPH == 1 || $RPH == 2 ]] || { echo "plan_cluster.sh: RPH must be 1 or 2" >&2; exit 2; }
[[ $HOSTS == 2 || ($HOSTS == 4 && $RPH == 1) ]] || { echo "plan_cluster.sh: HOSTS must be 2, or 4 with RPH=1" >&2; exit 2; }
if ((RPH == 1 && HOSTS == 4)); then
  VARIANTS=${VARIANTS:-"ep4+all fsdp2_ep2+all ep4_chunks4+all"}
elif ((RPH == 1)); then
  VARIANTS=${VARIANTS:-"ep2_chunks4+all ring2_chunks4+all"}
else
  VARIANTS=${VARIANTS:-"ep4+all fsdp2_ep2+all ep4_chunks4+all"}
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=/run/moe-cluster/plan/mpirun
# Item 5's run settings (scripts/overlap_hosts.sh): real-time side-engine workers and the TCP
# transport's eager limit and socket buffers raised, so a polled side op hands whole messages to
# the kernel instead of waiting for rendezvous round trips between polls (docs/offload.md).
ITEM5=(-x MOE_SIDE_ENGINE_RT=1 --mca btl_tcp_eager_limit 1048576 --mca btl_tcp_max_send_size 1048576
       --mca btl_tcp_sndbuf 4194304 --mca btl_tcp_rcvbuf 4194304)
# The all-to-all probes (nic_*): 4 MB per rank in A2A_CALLS calls, 256 KiB to each of the 4 ranks
# per call, the size of the steps' own messages (ep4: about 270 KB, its chunks 67 KB): one call of
# 1 MiB to each takes MPI's rendezvous path, which the steps' messages do not, and moved 228-231
# Mbit/s per rank at 4 hosts x 1 rank and 1gbit against 288-289 in 4 calls (2026-12-06). Rounds
# from before that: A2A_CALLS=1 with SKIP_MEASURED=1 solves their probes as measured.
A2A_CALLS=${A2A_CALLS:-4}
link_args() { [[ $1 == unshaped ]] || echo "--link $1"; }
# A link probe's time in seconds from its printed line (FILE, `moe bench --dist --probe-mb`): the
# faster of its two passes' medians (LINK_PASS=spinning: the first); "-" when FILE is missing.
probe_s() {
  [[ -f $1 ]] || { echo -; return; }
  python3 - "$1" "${LINK_PASS:-fastest}" <<'PY'
import re, sys
ms = [float(m) for m in re.findall(r"median ([0-9.]+) ms", open(sys.argv[1]).read())]
print((min(ms) if sys.argv[2] == "fastest" else ms[0]) * 1e-3)
PY
}
# Predicts every variant measured in OUT/m_cluster_TAG.json from OUT/rates_cluster_TAG.json on the
# 2-host cluster with RANKS ranks per host (one core per host), the link at BW GB/s and LAT us.
# RATES_FILE (default OUT/rates_cluster_TAG.json): the rates to predict from.
predict() {  # TAG RANKS BW LAT [A2A_BW]; HOSTS hosts on the machine's cores (cores per host: nproc / HOSTS)
  local v probe cl rates=${RATES_FILE:-$OUT/rates_cluster_$1.json}
  cl="hosts=$HOSTS,cores=$(python3 -c "print($(nproc) / $HOSTS)"),ranks_per_host=$2,threads=1,inter_bw=$3GB,inter_lat=$4us${5:+,inter_a2a_bw=$5GB}"
  while read -r v probe; do
    $MOE plan --rates "$rates" --bench-variant "$v" --cluster "$cl" \
      --json "$OUT/p_cluster_$1_$v.json" >/dev/null
    # At the speed the paired probe saw during the measurement (q_*.json; plan_validate.sh).
    [[ $probe == - ]] || $MOE plan --rates "$rates" --bench-variant "$v" --cluster "$cl" \
      --probe-ms "$probe" --json "$OUT/q_cluster_$1_$v.json" >/dev/null
  done < <(python3 -c 'import json,sys; [print(r["variant"], r.get("speed_probe_ms", "-")) for r in json.load(open(sys.argv[1]))["dist_results"]]' \
    "$OUT/m_cluster_$1.json")
}
if ((RPH == 1)); then
  for rate in "$@"; do
    tag=1x_$rate
    ((HOSTS == 2)) || tag=${HOSTS}x1_$rate
    if ! [[ ${SKIP_MEASURED:-0} == 1 && -f $OUT/m_cluster_$tag.json ]]; then
      "$C" down --name plan >/dev/null 2>&1 || true
      # shellcheck disable=SC2046
      "$C" up "$HOSTS" --name plan --ranks-per-host 1 $(link_args "$rate")
      "$C" placement --name plan "$HOSTS" --map-by node
      echo "load ($tag): $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
      $W -np "$HOSTS" --map-by node "${ITEM5[@]}" "$MOE" plan --calibrate --rates "$PWD/$OUT/rates.json" \
        --out "$PWD/$OUT/rates_cluster_$tag.json"
      if ((HOSTS > 2)); then
        # The link's α: 2 of the hosts, a rank each (-np 2 sets the file's `intra`: here the link
        # between them). Its bandwidths with every host sending at once, as in the step (4 hosts'
        # packet processing shares the machine's 2 cores: a pair alone moves 2.5 times what each
        # moves when all do): one stream each way per host (pairs of ranks all-gathering 4 MB each,
        # an FSDP pair's pattern: inter_bw), and the 4 ranks' all-to-all of 4 MB each (3 MB to the
        # 3 other hosts: inter_a2a_bw).
        $W -np 2 --map-by node "${ITEM5[@]}" "$MOE" plan --calibrate --rates "$PWD/$OUT/rates.json" \
          --out "$PWD/$OUT/link_$tag.json"
        $W -np "$HOSTS" --map-by node "${ITEM5[@]}" "$MOE" bench --dist --probe-mb 4 --probe-calls "$A2A_CALLS" --iters 7 |
          tee "$OUT/nic_$tag.txt"
        $W -np "$HOSTS" --map-by node "${ITEM5[@]}" "$MOE" bench --dist --probe-mb 4 --probe-pattern pairs \
          --probe-calls 1 --iters 7 | tee "$OUT/pairs_$tag.txt"
      fi
      args=()
      for v in $VARIANTS; do args+=(--variant "$v"); done
      $W -np "$HOSTS" --map-by node "${ITEM5[@]}" -x MOE_NUM_THREADS=1 "$MOE" bench --dist collective_liveness_s=60 --speed-probe 5 \
        --iters 5 --warmup 2 "${args[@]}" --json "$PWD/$OUT/m_cluster_$tag.json" || echo "bench failed at $tag"
      "$C" down --name plan
    fi
    [[ -f $OUT/m_cluster_$tag.json ]] || continue
    if ((HOSTS == 2)); then
      read -r bw lat < <(python3 -c 'import json,sys; i=json.load(open(sys.argv[1]))["intra"]; print(i["bw_gbps"], i["lat_us"])' \
        "$OUT/rates_cluster_$tag.json")
      predict "$tag" 1 "$bw" "$lat"
    else
      # The probes' median times t with the pair's α: the all-to-all, P ranks one per host,
      # t = C·(P-1)·α + n(P-1)/P/β, n = 4 MB in C = A2A_CALLS calls; the pairs' all-gather, t = α + n/β.
      read -r pair lat a2a < <(python3 - "$OUT/link_$tag.json" "$HOSTS" "$(probe_s "$OUT/nic_$tag.txt")" \
        "$(probe_s "$OUT/pairs_$tag.txt")" "$A2A_CALLS" <<'PY'
import json, sys
i = json.load(open(sys.argv[1]))["intra"]
P, t, tp, C = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
n, a = 4e6, i["lat_us"] * 1e-6
a2a = n * (P - 1) / P / max(t - C * (P - 1) * a, 0.5 * t) / 1e9
# Rounds measured before the pairs probe existed: the all-to-all's bandwidth for both.
pair = a2a if tp == "-" else n / max(float(tp) - a, 0.5 * float(tp)) / 1e9
print(pair, i["lat_us"], a2a)
PY
)
      echo "$a2a" >"$OUT/nic_$tag.gbps"
      echo "$pair" >"$OUT/pairs_$tag.gbps"
      # Every host sends at once in the step: the probes' bandwidths (0.31-0.34 Gbit/s per host at
      # 1gbit, where the one-pair calibration, the other hosts idle, saw 0.72-0.86); the pair's α.
      predict "$tag" 1 "$pair" "$lat" "$a2a"
    fi
  done
fi
if ((RPH == 2)); then for rate in "$@"; do
  if [[ ${SKIP_MEASURED:-0} == 1 && -f $OUT/m_cluster_$rate.json ]]; then measured=1; else measured=0; fi
  if ((measured == 0)); then
  "$C" down --name plan >/dev/null 2>&1 || true
  # shellcheck disable=SC2046
  "$C" up 2 --name plan --ranks-per-host 2 $(link_args "$rate")
  "$C" placement --name plan 4
  echo "load ($rate): $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
  $W -np 2 --map-by node "$MOE" plan --calibrate --rates "$PWD/$OUT/rates.json" --out "$PWD/$OUT/link_$rate.json"
  $W -np 4 "$MOE" plan --calibrate --rates "$PWD/$OUT/rates.json" --out "$PWD/$OUT/rates_cluster_$rate.json"
  $W -np 4 "$MOE" bench --dist --probe-mb 4 --probe-calls "$A2A_CALLS" --iters 7 | tee "$OUT/nic_$rate.txt"
  # Pairs across the link with both ranks of each host streaming at once (--map-by node: ranks 2i
  # and 2i+1 on different hosts), as an FSDP pair's gathers and reductions run in the step.
  $W -np 4 --map-by node "$MOE" bench --dist --probe-mb 4 --probe-pattern pairs --probe-calls 1 --iters 7 |
    tee "$OUT/pairs_$rate.txt"
  args=()
  for v in $VARIANTS; do args+=(--variant "$v"); done
  # A slow link under load can starve the watchdog's liveness probe: give it a minute.
  $W -np 4 -x MOE_NUM_THREADS=1 "$MOE" bench --dist collective_liveness_s=60 --speed-probe 5 --iters 5 --warmup 2 "${args[@]}" \
    --json "$PWD/$OUT/m_cluster_$rate.json" || echo "bench failed at $rate"
  "$C" down --name plan
  fi
  [[ -f $OUT/m_cluster_$rate.json ]] || continue
  # β_inter of one host's NIC from the probe's median t (P=4 ranks, p=2 per host, n=4 MB per rank):
  #   t = C·((p-1)·α_intra + (P-p)·α_inter) + n(p-1)/P/β_intra + p·n(P-p)/P/β_inter, C = A2A_CALLS
  # with β_intra at half a core per rank (the model's scaling of shared-memory copies).
  read -r bw lat pair_bw < <(python3 - "$OUT/link_$rate.json" "$OUT/rates.json" "$(probe_s "$OUT/nic_$rate.txt")" \
    "$(probe_s "$OUT/pairs_$rate.txt")" "$A2A_CALLS" <<'PY'
import json, sys
i = json.load(open(sys.argv[1]))["intra"]
r = json.load(open(sys.argv[2]))["intra"]
t, tp, C = float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
P, p, n = 4, 2, 4e6
a_intra, a_inter, b_intra = r["lat_us"] * 1e-6, i["lat_us"] * 1e-6, r["bw_gbps"] * 1e9 * 0.5
rest = t - C * ((p - 1) * a_intra + (P - p) * a_inter) - n * (p - 1) / P / b_intra
# The NIC for pairwise traffic: both ranks of a host each move n in t = α_inter + n/β_rank; rounds
# measured before the pairs probe: the one-rank-per-host calibration's.
pair = i["bw_gbps"] if tp == "-" else p * n / max(float(tp) - a_inter, 0.5 * float(tp)) / 1e9
print(p * n * (P - p) / P / rest / 1e9, i["lat_us"], pair)
PY
)
  echo "$bw" >"$OUT/nic_$rate.gbps"
  # The network stack's CPU per byte between hosts: the calibration under -np 4 has ranks sharing
  # hosts and cannot measure it (its file keeps the 1.3 ns/B of one host's TCP probe); the link's
  # calibration, one rank per host over the same links, measures it (9.1-11.4 ns/B at 1gbit in
  # out/v72-v75). NET_CPU=default: the -np 4 file as it is (the predictions before 2026-12-06).
  rates_file=$OUT/rates_cluster_$rate.json
  if [[ ${NET_CPU:-link} == link ]]; then
    rates_file=$OUT/rates_cluster_${rate}_net.json
    python3 - "$OUT/rates_cluster_$rate.json" "$OUT/link_$rate.json" "$rates_file" <<'PY'
import json, sys
r, link = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
r["comm_cpu_ns_per_byte"] = link["comm_cpu_ns_per_byte"]
json.dump(r, open(sys.argv[3], "w"), indent=1)
PY
  fi
  # One core per host (the harness splits the 2 cores): 0.5 core per rank. The link's bandwidth for
  # one stream per pair of hosts (the gathers, the all-reduces, a pair's reduce-scatter): the pairs
  # probe's, both ranks of each host streaming (0.53-0.60 Gbit/s a host at 1gbit, where one rank
  # per host with the other idle moves 0.62-0.80); the all-to-alls': the all-to-all probe's (each
  # rank to both ranks of the other host at once).
  RATES_FILE=$rates_file predict "$rate" 2 "$pair_bw" "$lat" "$bw"
done; fi
python3 - "$OUT" "$RPH" "$HOSTS" "$@" <<'PY'
import json, sys, os
out, rph, hosts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
what = ("GB/s, α us (2 hosts x 1 rank)" if hosts == 2 else "GB/s pairs, α us (4 hosts x 1 rank)") if rph == 1 \
    else "NIC GB/s (2 ranks per host), α us"
print("| link (tc rate) | measured link: %s | variant | measured median ms (min-max) | predicted ms | predicted / measured | measured exposed ms | predicted exposed ms | paired probe: predicted ms, / measured |" % what)
print("|---|---|---|---|---|---|---|---|---|")
for rate in sys.argv[4:]:
    tag = ("1x_" if hosts == 2 else "%dx1_" % hosts) + rate if rph == 1 else rate
    if not os.path.exists(os.path.join(out, "m_cluster_%s.json" % tag)):
        continue
    if rph == 1 and hosts == 2:
        i = json.load(open(os.path.join(out, "rates_cluster_%s.json" % tag)))["intra"]
        bw = i["bw_gbps"]
    elif rph == 1:
        i = json.load(open(os.path.join(out, "link_%s.json" % tag)))["intra"]
        f = os.path.join(out, "pairs_%s.gbps" % tag)
        bw = float(open(f if os.path.exists(f) else os.path.join(out, "nic_%s.gbps" % tag)).read())
    else:
        i = json.load(open(os.path.join(out, "link_%s.json" % rate)))["intra"]
        bw = float(open(os.path.join(out, "nic_%s.gbps" % rate)).read())
    for r in json.load(open(os.path.join(out, "m_cluster_%s.json" % tag)))["dist_results"]:
        p = json.load(open(os.path.join(out, "p_cluster_%s_%s.json" % (tag, r["variant"]))))["ranked"][0]
        ratio = p["step_ms"] / r["median_ms"]
        qf = os.path.join(out, "q_cluster_%s_%s.json" % (tag, r["variant"]))
        paired = "-"
        if os.path.exists(qf):
            q = json.load(open(qf))["ranked"][0]["step_ms"]
            paired = "%.1f, %.2f%s" % (q, q / r["median_ms"], "" if abs(q / r["median_ms"] - 1) <= 0.2 else " **off**")
        print("| %s | %.3f, %.0f | %s | %.1f (%.1f-%.1f) | %.1f | %.2f%s | %.1f | %.1f | %s |" % (rate, bw, i["lat_us"],
              r["variant"], r["median_ms"], r["min_ms"], r["max_ms"], p["step_ms"], ratio, "" if abs(ratio - 1) <= 0.2 else " **off**",
              r["exposed_comm_ms"], p["exposed_comm_ms"], paired))
PY
