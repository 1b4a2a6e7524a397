#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (unit, layer, CLI, MPI), then the
# ThreadSanitizer run of the concurrent classes (scripts/tsan.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "${MOE_JOBS:-2}"
bash scripts/tsan.sh
