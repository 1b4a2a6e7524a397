#!/usr/bin/env bash
# The main job: install the Debian packages, build, then train the Mixtral-style MoE language
# model on the `fortunes` corpus (scripts/run_lm.sh: examples/tiny_mixtral.py with the engine's
# MoELayer; metrics, checkpoints and report.svg under out/lm). MOE_RANKS=2 runs it on two MPI
# ranks with expert parallelism. Flags after the command go to examples/tiny_mixtral.py.
#
#   bash scripts/run.sh [tiny_mixtral.py flags ...]
#   bash scripts/run.sh --cpp     # the C++-only job instead: `moe train` + report, one `moe step`
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
if [[ ${1:-} != --cpp ]]; then
  exec bash scripts/run_lm.sh "$@"
fi
out=${MOE_OUT:-out}
rm -rf "$out/train"
mkdir -p "$out/train" "$out/example"
# Training: prints the resolved config, progress, and the summary (loss first -> last, throughput).
./build/moe train metrics_file="$out/train/metrics.jsonl" checkpoint_dir="$out/train/checkpoints" \
  checkpoint_period=1000
./build/moe report "$out/train/metrics.jsonl" --out "$out/train/report.svg"
# One layer step on a small example (SPEC.md §7 file contract).
./build/moe init --config examples/small.yaml --out "$out/example/weights.safetensors" --seed 1 \
  --inputs "$out/example/inputs.safetensors" --tokens 256
./build/moe step --config examples/small.yaml --weights "$out/example/weights.safetensors" \
  --inputs "$out/example/inputs.safetensors" --out "$out/example/outputs.safetensors"
