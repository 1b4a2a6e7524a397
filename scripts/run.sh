#!/usr/bin/env bash
# The main job: install, build, then run the engine on a small example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
out=${MOE_OUT:-out/example}
mkdir -p "$out"
./build/moe init --config examples/small.yaml --out "$out/weights.safetensors" --seed 1 \
  --inputs "$out/inputs.safetensors" --tokens 256
./build/moe step --config examples/small.yaml --weights "$out/weights.safetensors" \
  --inputs "$out/inputs.safetensors" --out "$out/outputs.safetensors"
