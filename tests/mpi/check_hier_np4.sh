#!/bin/sh
# moe check of the hierarchical all-to-all as 2 hosts x 2 ranks on one machine
# (MOE_RANKS_PER_HOST=2): every hierarchical variant must equal its flat
# counterpart bit for bit (moe check's exit status), and each all-to-all must
# count as two A2As (its two phases), everything else as in the flat run.
# Usage: check_hier_np4.sh MOE MPIEXEC JSON
set -eu
moe=$1 mpiexec=$2 json=$3
MOE_RANKS_PER_HOST=2 "$mpiexec" --oversubscribe -np 4 "$moe" check --json "$json" \
  --variant ep4_hier ep4_hier_chunks4 ep4_hier+all ep4_hier_chunks4+all
/usr/bin/python3 - "$json" <<'PY'
import json, sys
want = {  # AR AG A2A RS SO per step (world rank 0)
    "ep4": (1, 2, 4, 0, 0), "ep4_hier": (1, 2, 8, 0, 0),
    "ep4_chunks4": (1, 5, 16, 0, 0), "ep4_hier_chunks4": (1, 5, 32, 0, 0),
    "ep4_hier+all": (1, 2, 8, 0, 6), "ep4_hier_chunks4+all": (1, 5, 32, 0, 24),
}
got = {v["name"]: v for v in json.load(open(sys.argv[1]))["variants"]}
bad = []
for name, counts in want.items():
    v = got.get(name)
    if v is None or v["skipped"] or v["verdict"] != "PASS":
        bad.append(f"{name}: not run or not PASS ({v and v['verdict']})")
        continue
    c = v["collectives"]
    have = (c["AR"], c["AG"], c["A2A"], c["RS"], c["SO"])
    if have != counts:
        bad.append(f"{name}: AR AG A2A RS SO = {have}, expected {counts}")
print("\n".join(bad) if bad else "check_hier_np4: OK")
sys.exit(1 if bad else 0)
PY
