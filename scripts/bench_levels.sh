#!/usr/bin/env bash
# Benchmarks every kernel level this CPU runs (docs/benchmarks.md, "Kernel levels"): `moe bench`
# at MOE_GEMM_ISA=<level> beside oneDNN limited to the same level (ONEDNN_MAX_CPU_ISA), so each
# level's ratios against the dense baseline are measured in one run, on one machine. On AArch64
# (levels neon, neon_bf16) the baseline is oneDNN's when the build has it, unlimited (its Arm ISA
# names differ), else the one-group grouped GEMM at the same level.
# Usage: scripts/bench_levels.sh [ITERS] [OUT_DIR]   (after scripts/build.sh)
# Writes OUT_DIR/<level>_<dtype>.json (default out/bench_levels) and prints each table.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-5}
out=${2:-out/bench_levels}
mkdir -p "$out"
source scripts/levels.sh
for level in avx2 avx512 avx512_bf16 amx_bf16 neon neon_bf16; do
  if ! MOE_GEMM_ISA=$level build/moe --help >/dev/null 2>&1; then
    echo "== $level: skipped (this CPU or build lacks it)"
    continue
  fi
  for dtype in f32 bf16; do
    echo "== $level $dtype (ONEDNN_MAX_CPU_ISA=$(onednn_isa "$level"))"
    MOE_GEMM_ISA=$level ONEDNN_MAX_CPU_ISA=$(onednn_isa "$level") build/moe bench --dtype "$dtype" \
      --case seed-mixtral --case many-experts --case gemma-like --iters "$iters" --warmup 1 \
      --json "$out/${level}_${dtype}.json"
  done
done
