#!/usr/bin/env bash
# Configures and builds into ./build (Release, Ninja, 2 jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${MOE_JOBS:-2}"
