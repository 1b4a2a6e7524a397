#!/usr/bin/env bash
# Installs, builds and runs the whole test suite with CTest (unit, layer, CLI, MPI, the
# ThreadSanitizer run of the concurrent classes, scripts/tsan.sh, and the ASan + UBSan run of the
# whole suite, scripts/sanitize.sh, as one entry each), ending in
# CTest's one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "${MOE_JOBS:-2}"
