#!/usr/bin/env bash
# The public models' expert shapes (the [model] cases of `moe bench --list`) at every kernel level
# this CPU runs, each case both in one process with the others (same-process: one `moe bench` over
# every case, in registry order) and alone in a fresh process (docs/benchmarks.md, "Real models:
# results per kernel level"). oneDNN's dense baseline is limited to the same level
# (ONEDNN_MAX_CPU_ISA), as in scripts/bench_levels.sh.
# Usage: scripts/bench_models.sh [ITERS] [OUT_DIR] [LEVEL...]   (after scripts/build.sh)
#   defaults: ITERS 3, OUT_DIR out/bench_models, every level this CPU and build have.
# Writes OUT_DIR/<level>_same.json and OUT_DIR/<level>_fresh_<case>.json, then prints one markdown
# table per level: the fused and split variants' fraction of the dense baseline, fwd and fwd+bwd,
# same-process / fresh-process, with cells below 0.90 in bold.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-3}
out=${2:-out/bench_models}
shift $(($# >= 2 ? 2 : $#))
levels=("$@")
((${#levels[@]})) || levels=(avx2 avx512 avx512_bf16 amx_bf16 neon neon_bf16)
mkdir -p "$out"
mapfile -t cases < <(build/moe bench --list | awk '/\[model\]/ {print $1}')
source scripts/levels.sh
ran=()
for level in "${levels[@]}"; do
  if ! MOE_GEMM_ISA=$level build/moe --help >/dev/null 2>&1; then
    echo "== $level: skipped (this CPU or build lacks it)"
    continue
  fi
  ran+=("$level")
  run() { MOE_GEMM_ISA=$level ONEDNN_MAX_CPU_ISA=$(onednn_isa "$level") build/moe bench --dtype bf16 \
            --iters "$iters" --warmup 1 "$@" >/dev/null; }
  echo "== $level: same process (${cases[*]})"
  args=()
  for c in "${cases[@]}"; do args+=(--case "$c"); done
  run "${args[@]}" --json "$out/${level}_same.json"
  for c in "${cases[@]}"; do
    echo "== $level: $c in a fresh process"
    run --case "$c" --json "$out/${level}_fresh_$c.json"
  done
done
python3 - "$out" "${ran[@]}" <<'PY'
import json, pathlib, sys
out, levels = pathlib.Path(sys.argv[1]), sys.argv[2:]
def rows(path):
    d = json.loads(path.read_text())
    return d, {(r["case"], r["variant"], r["pass"]): r for r in d["results"]}
cols = [("fused", "fwd"), ("fused", "fwd+bwd"), ("split", "fwd"), ("split", "fwd+bwd")]
for level in levels:
    same_doc, same = rows(out / f"{level}_same.json")
    base = same_doc["dense_baseline"]
    print(f"\n**{level}** (dense baseline: {base['impl']} {base['dtype']}, {base.get('kernel', '')}); "
          "cells: same-process / fresh-process fraction of dense")
    print("\n| case | " + " | ".join(f"{k} {v}" for k, v in cols) + " | fused fwd+bwd GFLOP/s same / fresh (dense) |")
    print("|---|" + "---|" * (len(cols) + 1))
    cases = list(dict.fromkeys(r["case"] for r in same_doc["results"]))
    for case in cases:
        _, fresh = rows(out / f"{level}_fresh_{case}.json")
        cells = []
        for kernel, v in cols:
            a, b = same[(case, kernel, v)], fresh[(case, kernel, v)]
            fa, fb = a["fraction_of_dense"], b["fraction_of_dense"]
            cell = f"{fa:.2f} / {fb:.2f}"
            cells.append(f"**{cell}**" if min(fa, fb) < 0.90 else cell)
        a, b = same[(case, "fused", "fwd+bwd")], fresh[(case, "fused", "fwd+bwd")]
        cells.append(f"{a['gflops']:.0f} / {b['gflops']:.0f} ({a['dense_gflops']:.0f})")
        print(f"| {case} | " + " | ".join(cells) + " |")
PY
