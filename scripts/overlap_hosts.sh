#!/usr/bin/env bash
# Overlap across hosts (docs/benchmarks.md, "Overlap across hosts"): `moe bench --dist` on a
# scripts/cluster.sh cluster of 2 hosts and of 4 hosts (one rank per host, TCP between hosts),
# at each link setting, every offload variant against its baseline (offload off). Prints, per
# variant, the step and the exposed communication with and without offload, and the share of the
# step that stays exposed; and the link's measured rate next to one rank's compute-only step, the
# ratio of compute to communication that the setting stands for.
# Usage (as root, after scripts/build.sh): scripts/overlap_hosts.sh [ITERS] [OUT_DIR]
#   env OVERLAP_RATES: link settings (default "none 400mbit"; none = unshaped veth)
#       OVERLAP_HOSTS: host counts (default "2 4")
#       OVERLAP_ARGS:  extra args for moe bench --dist (e.g. "--tokens 512")
# Writes OUT_DIR/h<hosts>_<rate>.json (default out/overlap_hosts) and the probe outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-7}
out=${2:-out/overlap_hosts}
rates=${OVERLAP_RATES:-none 400mbit}
hosts_list=${OVERLAP_HOSTS:-2 4}
mkdir -p "$out"
[ -x build/moe ] || { echo "overlap_hosts.sh: build first (scripts/build.sh)"; exit 1; }
name=ovl$$
trap 'scripts/cluster.sh down --name "$name" >/dev/null 2>&1 || true' EXIT
# One compute thread per rank and real-time side-engine workers, as scripts/overlap.sh; the TCP
# transport tuned the same way (eager messages up to 1 MiB, 4 MiB socket buffers).
env_args=(-x MOE_NUM_THREADS=1 -x MOE_SIDE_ENGINE_RT=1)
tcp_args=(--mca btl_tcp_eager_limit 1048576 --mca btl_tcp_max_send_size 1048576
          --mca btl_tcp_sndbuf 4194304 --mca btl_tcp_rcvbuf 4194304)
for hosts in $hosts_list; do
  case $hosts in
    2) variants=(ep2_chunks4+all ring2_chunks4+all) ;;
    4) variants=(ep4+ep_collectives ep4+ragged_sort ep4+all fsdp4+fsdp_all_gather fsdp2_ep2+all
                 ep4_chunks4+all ring4_chunks4+all) ;;
    *) echo "overlap_hosts.sh: hosts must be 2 or 4 (the variants' rank counts)"; exit 1 ;;
  esac
  for rate in $rates; do
    link=()
    [ "$rate" = none ] || link=(--link "$rate")
    set +e
    up=$(scripts/cluster.sh up "$hosts" --name "$name" --ranks-per-host 1 "${link[@]}" 2>&1)
    rc=$?
    set -e
    [ $rc -eq 77 ] && { echo "overlap_hosts.sh: SKIPPED: $up"; exit 77; }
    [ $rc -eq 0 ] || { echo "$up"; exit 1; }
    grep -E '^cluster|link|cpus' <<<"$up" | head -3
    mpi=(/run/moe-cluster/$name/mpirun "${env_args[@]}" "${tcp_args[@]}")
    tag=h${hosts}_${rate}
    scripts/cluster.sh placement --name "$name" "$hosts" | tee "$out/${tag}_placement.txt"
    echo "== $hosts hosts, link $rate: link probe (8 MB all-to-all per rank)"
    "${mpi[@]}" -np "$hosts" "$PWD/build/moe" bench --dist --probe-mb 8 --iters 3 | tee "$out/${tag}_probe.txt"
    echo "== $hosts hosts, link $rate: compute only (one rank of ep2_chunks4, no communication)"
    "${mpi[@]}" -np 1 "$PWD/build/moe" bench --dist --variant compute_only_ep2_chunks4 --iters "$iters" \
      --warmup 2 ${OVERLAP_ARGS:-} | tee "$out/${tag}_compute.txt"
    echo "== $hosts hosts, link $rate: offload variants and their baselines"
    vargs=()
    for v in "${variants[@]}"; do vargs+=(--variant "$v"); done
    # shellcheck disable=SC2086
    "${mpi[@]}" -np "$hosts" "$PWD/build/moe" bench --dist "${vargs[@]}" --iters "$iters" --warmup 2 \
      --json "$out/$tag.json" ${OVERLAP_ARGS:-}
    scripts/cluster.sh down --name "$name" >/dev/null
  done
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in sorted(out.glob("h*_*.json")):
    d = json.loads(path.read_text())
    rows = {r["variant"]: r for r in d["dist_results"]}
    print(f"\n**{path.stem}** (medians, ms; exposed share = exposed / step)\n")
    print("| variant | baseline step / exposed (share) | offload step / exposed (share) | exposed change |")
    print("|---|---|---|---|")
    for r in d["dist_results"]:
        if r.get("baseline") in (None, "", r["variant"]):
            continue
        b = rows[r["baseline"]]
        share = lambda x: 100.0 * x["exposed_comm_ms"] / x["median_ms"]
        change = (r["exposed_comm_ms"] / b["exposed_comm_ms"] - 1) * 100 if b["exposed_comm_ms"] > 0 else 0.0
        print(f"| {r['variant']} | {b['median_ms']:.2f} / {b['exposed_comm_ms']:.2f} ({share(b):.0f}%) | "
              f"{r['median_ms']:.2f} / {r['exposed_comm_ms']:.2f} ({share(r):.0f}%) | {change:+.0f}% |")
PY
