#!/bin/sh
# moe plan --calibrate under mpirun (docs/formats.md, "Plan rates"): one process writes the rates,
# -np 2 and -np 4 each add a contention row with its measured all-gather bandwidth, and the model
# prices a 4-rank layout from the file.
# Usage: plan_calibrate_np.sh MPIEXEC MOE DIR
set -eu
MPIEXEC=$1 MOE=$2 DIR=$3
rm -rf "$DIR" && mkdir -p "$DIR"
"$MOE" plan --calibrate --tiny --out "$DIR/rates.json" >"$DIR/np1.log"
for np in 2 4; do
  "$MPIEXEC" --oversubscribe -np $np "$MOE" plan --calibrate --tiny --rates "$DIR/rates.json" \
    --out "$DIR/rates.json" >"$DIR/np$np.log" 2>&1 || { cat "$DIR/np$np.log"; exit 1; }
  grep -Eq "all-gather of 8 MiB per rank inside each host \($np ranks\) [0-9.]+ ms -> [0-9.]+ GB/s per rank" "$DIR/np$np.log" ||
    { echo "np $np: no all-gather measurement in the log"; cat "$DIR/np$np.log"; exit 1; }
done
n=$(grep -c '"ag_bw_gbps"' "$DIR/rates.json")
[ "$n" -eq 2 ] || { echo "expected 2 contention rows with ag_bw_gbps, found $n"; cat "$DIR/rates.json"; exit 1; }
out=$("$MOE" plan --rates "$DIR/rates.json" --bench-variant baseline_fsdp4 --tokens 16 emb_dim=64 moe_mlp_dim=32 \
  --cluster cores=2,ranks_per_host=4)
echo "$out"
echo "$out" | grep -q "d1 f4 e1 c1 +none"
echo "plan_calibrate_np: OK"
