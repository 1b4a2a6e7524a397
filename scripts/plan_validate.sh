#!/bin/bash
# moe plan's validation on this machine (docs/distributed.md, "Model of scale"): calibrate, then
# measure the `moe bench --dist` variants on 1, 2 and 4 ranks back to back (the calibration under
# mpirun -np 2 and -np 4 adds the shared-memory link and the contention of 1 and 2 ranks per core),
# then predict each with
# `moe plan --bench-variant` on the matching cluster (2 cores, N ranks, one pool thread per rank)
# and print the table of predicted against measured step times.
# Usage: scripts/plan_validate.sh [OUT_DIR] [ITERS]     (build/moe must exist)
# SKIP_MEASURED=1: where OUT_DIR already holds a round's rates and measurements, only predict them
# again (the model's changes replayed against rounds measured before).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/plan}
ITERS=${2:-7}
MOE=build/moe
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun --oversubscribe --mca mpi_yield_when_idle 1"
CORES=$(nproc)
if [[ ${SKIP_MEASURED:-0} == 1 && -f $OUT/rates.json && -f $OUT/m_np4.json ]]; then
  echo "SKIP_MEASURED=1: predicting the rates and measurements already in $OUT"
else
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load.txt"
  $MOE plan --calibrate --out "$OUT/rates.json" --iters 5
  $MPI -np 2 $MOE plan --calibrate --rates "$OUT/rates.json" --out "$OUT/rates.json"
  $MPI -np 4 $MOE plan --calibrate --rates "$OUT/rates.json" --out "$OUT/rates.json"
  echo "load after calibration: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
  # --speed-probe: every rank at once times a fixed one-thread step before and after each variant;
  # each variant is then predicted twice: from the calibrated rates (p_*.json) and at the speed the
  # probe saw during its measurement (q_*.json, moe plan --probe-ms).
  B="bench --dist --iters $ITERS --warmup 2 --speed-probe 5"
  MOE_NUM_THREADS=1 $MOE $B --variant compute_only_ep2_chunks4 --json "$OUT/m_np1_t1.json"
  MOE_NUM_THREADS=1 $MOE $B --variant compute_only_ep2_chunks4 --tokens 1024 --json "$OUT/m_np1_t1_T1024.json"
  $MOE $B --variant compute_only_ep2_chunks4 --json "$OUT/m_np1_pool.json"
  MOE_NUM_THREADS=1 $MPI -np 2 $MOE $B --variant ep2_chunks4+all --variant ring2_chunks4+all --json "$OUT/m_np2.json"
  MOE_NUM_THREADS=1 $MPI -np 4 $MOE $B --variant fsdp4+fsdp_all_gather --variant ep4+all --variant fsdp2_ep2+all \
    --variant ep4_chunks4+all --variant baseline_ring4_chunks4 --json "$OUT/m_np4.json"
  echo "load after measurement: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
fi
predict() {  # json tokens ranks threads tag
  python3 - "$1" "$OUT/$5" <<'PY' | while read -r v probe; do
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["dist_results"]:
    print(r["variant"], r.get("speed_probe_ms", "-"))
PY
    $MOE plan --rates "$OUT/rates.json" --bench-variant "$v" --tokens "$2" \
      --cluster "cores=$CORES,ranks_per_host=$3,threads=$4" --json "$OUT/p_$5_$v.json" >/dev/null
    [[ $probe == - ]] || $MOE plan --rates "$OUT/rates.json" --bench-variant "$v" --tokens "$2" \
      --cluster "cores=$CORES,ranks_per_host=$3,threads=$4" --probe-ms "$probe" --json "$OUT/q_$5_$v.json" >/dev/null
  done
}
predict "$OUT/m_np1_t1.json" 256 1 1 np1_t1.json
predict "$OUT/m_np1_t1_T1024.json" 1024 1 1 np1_t1_T1024.json
predict "$OUT/m_np1_pool.json" 256 1 "$CORES" np1_pool.json
predict "$OUT/m_np2.json" 256 2 1 np2.json
predict "$OUT/m_np4.json" 256 4 1 np4.json
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
print("| run | variant | ranks | measured median ms (min-max) | predicted ms | predicted / measured | measured exposed ms | predicted exposed ms | speed probe ms (calibration) | paired: predicted ms, / measured |")
print("|---|---|---|---|---|---|---|---|---|---|")
cal = json.load(open(os.path.join(out, "rates.json"))).get("speed_probe_ms")
for tag, label in [("np1_t1.json", "1 process, 1 thread"), ("np1_t1_T1024.json", "1 process, 1 thread, T=1024"),
                   ("np1_pool.json", "1 process, full pool"), ("np2.json", "mpirun -np 2"), ("np4.json", "mpirun -np 4")]:
    d = json.load(open(os.path.join(out, "m_" + tag)))
    for r in d["dist_results"]:
        p = json.load(open(os.path.join(out, "p_%s_%s.json" % (tag, r["variant"]))))["ranked"][0]
        ratio = p["step_ms"] / r["median_ms"]
        qf = os.path.join(out, "q_%s_%s.json" % (tag, r["variant"]))
        probe, paired = "-", "-"
        if os.path.exists(qf) and cal:
            q = json.load(open(qf))["ranked"][0]["step_ms"]
            probe = "%.1f (%.1f)" % (r["speed_probe_ms"], cal)
            paired = "%.1f, %.2f%s" % (q, q / r["median_ms"], "" if abs(q / r["median_ms"] - 1) <= 0.2 else " **off**")
        print("| %s | %s | %d | %.1f (%.1f-%.1f) | %.1f | %.2f%s | %.1f | %.1f | %s | %s |" % (label, r["variant"], r["ranks"], r["median_ms"],
              r["min_ms"], r["max_ms"], p["step_ms"], ratio, "" if abs(ratio - 1) <= 0.2 else " **off**",
              r["exposed_comm_ms"], p["exposed_comm_ms"], probe, paired))
PY
