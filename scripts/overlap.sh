#!/usr/bin/env bash
# The overlap demo (docs/benchmarks.md, "Distributed"): 2 ranks talking over a
# network slower than shared memory. A private network namespace whose
# loopback is rate-limited with tbf; MPI over TCP on that loopback only
# (ob1 + tcp, no shared memory), so every byte crosses the limited device.
# Then `moe bench --dist` on the 2-rank variants: compute alone, the
# baselines (offload off) and every target live with 4 token chunks.
#
# Usage (as root): scripts/overlap.sh [RATE [ITERS]]   e.g. scripts/overlap.sh 2gbit 15
# Env: OVERLAP_ARGS: extra args for moe bench (e.g. "--tokens 512 emb_dim=2048");
#      OVERLAP_JSON: where to write the JSON (default out/overlap.json).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-2gbit}
iters=${2:-7}
json=${OVERLAP_JSON:-out/overlap.json}
ns=moe_overlap_$$
mkdir -p "$(dirname "$json")"
[ -x build/moe ] || { echo "overlap.sh: build first (scripts/build.sh)"; exit 1; }
if ! ip netns add "$ns" 2>/tmp/overlap_netns.err; then
  echo "overlap.sh: BLOCKED: 'ip netns add $ns' failed: $(cat /tmp/overlap_netns.err)"
  echo "overlap.sh: not rate-limiting the shared loopback instead (other processes use it)"
  exit 2
fi
trap 'ip netns del "$ns"' EXIT
in_ns() { ip netns exec "$ns" "$@"; }
in_ns ip link set lo up
# tbf: a token bucket on the namespace's loopback. The burst is one packet (lo's MTU is 64 KiB)
# plus a little: a larger bucket banks the link's idle time while a rank computes and lets the
# next message through at memory speed (a 256 KB bucket holds a whole chunk's all-to-all).
in_ns tc qdisc add dev lo root tbf rate "$rate" burst 70kb latency 400ms
in_ns tc qdisc show dev lo
# One compute thread per rank (2 ranks on 2 cores); real-time side-engine workers (DistRuntime):
# with no core to spare they must preempt the compute thread to keep the link busy.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOE_NUM_THREADS=${MOE_NUM_THREADS:-1}
export MOE_SIDE_ENGINE_RT=${MOE_SIDE_ENGINE_RT:-1}
# TCP transport: messages up to 1 MiB go eagerly (no rendezvous round trips, each of which waits
# for the peer's next MPI poll) through 4 MiB socket buffers, so one poll hands a whole chunk's
# bytes to the kernel and the link drains them between polls (docs/benchmarks.md: step 27-29 ->
# 25 ms at 2gbit, the polite probe at the spinning probe's speed).
mpi=(mpirun --oversubscribe -np 2 --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo --mca mpi_yield_when_idle 1
     --mca btl_tcp_eager_limit 1048576 --mca btl_tcp_max_send_size 1048576
     --mca btl_tcp_sndbuf 4194304 --mca btl_tcp_rcvbuf 4194304)
echo "== link probe: the limit must show (without the qdisc this loopback moved 3.1 Gbit/s per rank here)"
in_ns "${mpi[@]}" ./build/moe bench --dist --probe-mb 8 --iters 3
echo "== communication only: the bytes of a step's all-to-alls (ep2_chunks4: 4.2 MB per rank in 16 calls) and nothing else"
in_ns "${mpi[@]}" ./build/moe bench --dist --probe-mb 4.2 --probe-calls 16 --iters "$iters"
echo "== communication only, ring: as many bytes out of each rank as a ring2_chunks4 step (1.05 MB AG + 2.1 MB RS) in 25 calls"
in_ns "${mpi[@]}" ./build/moe bench --dist --probe-mb 6.3 --probe-calls 25 --iters "$iters"
echo "== compute only: one rank doing one ep2 rank's work (no communication, nobody else waiting)"
in_ns "${mpi[@]/-np 2/-np 1}" ./build/moe bench --dist --iters "$iters" --warmup 2 \
  --variant compute_only_ep2_chunks4 --json "${json%.json}_compute.json" ${OVERLAP_ARGS:-}
echo "== compute only, both cores busy: two such 1-rank jobs at once (what sharing the machine costs)"
# shellcheck disable=SC2086
# (--bind-to none: two separate jobs would otherwise both bind their rank 0 to core 0)
for j in 0 1; do
  in_ns "${mpi[@]/-np 2/-np 1}" --bind-to none ./build/moe bench --dist --iters "$iters" --warmup 2 \
    --variant compute_only_ep2_chunks4 ${OVERLAP_ARGS:-} > "${json%.json}_compute_pair$j.txt" 2>&1 &
done
wait
grep -h compute_only "${json%.json}"_compute_pair*.txt
echo "== 2 ranks over $rate: baselines (offload off) and every target live, 4 token chunks"
# shellcheck disable=SC2086
in_ns "${mpi[@]}" ./build/moe bench --dist --iters "$iters" --warmup 2 --json "$json" \
  --trace-dir "${json%.json}_traces" --variant ep2_chunks4+all --variant ring2_chunks4+all ${OVERLAP_ARGS:-}
