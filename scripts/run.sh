#!/usr/bin/env bash
# The main job: install, build, train the MoE stack with the embedded default
# config (metrics and checkpoints under out/), draw the report, then run one
# layer step on a small example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
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
