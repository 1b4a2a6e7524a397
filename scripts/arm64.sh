#!/usr/bin/env bash
# AArch64: cross-build the engine with Debian's cross toolchain into build-arm64
# (cmake/aarch64-linux-gnu.cmake) and run test binaries under user-mode emulation (qemu-user).
# docs/architecture.md "AArch64" has what runs where; the CTest entries arm64_* call this.
#
#   scripts/arm64.sh build                 configure + build moe and moe_tests (prints the time)
#   scripts/arm64.sh test CPU [FILTER]     moe_tests under qemu-aarch64 -cpu CPU (max: BF16, SVE;
#                                          cortex-a72 / neoverse-n1: no BF16), gtest filter FILTER
#   scripts/arm64.sh step CPU              `moe step` of tests/data arm64 vs the host's x86 build
#                                          (bit-exact at the reference level, within the bf16
#                                          dot product's bound at neon_bf16)
# Env: MOE_ARM64_BUILD (build-arm64), MOE_HOST_BUILD (build, for `step`), MOE_JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${MOE_ARM64_BUILD:-build-arm64}
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
need() { [ -n "$qemu" ] || { echo "arm64.sh: qemu-aarch64 not found (qemu-user: scripts/install_deps.sh)"; exit 1; }; }

case ${1:-} in
build)
  command -v aarch64-linux-gnu-g++ >/dev/null ||
    { echo "arm64.sh: aarch64-linux-gnu-g++ not found (crossbuild-essential-arm64: scripts/install_deps.sh)"; exit 1; }
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  start=$(date +%s)
  # No MPI (libopenmpi-dev:arm64 does not install beside the amd64 one) and no oneDNN (the dense
  # baseline's fallback, a one-group grouped GEMM, is measured instead). Build type Emulated, -O1
  # (MOE_ARM64_OPT): this build is for correctness under emulation, where -O3 buys little and costs
  # compile time on CI's two cores; the values are the same (IEEE semantics at every -O:
  # -ffp-contract=off, no fast-math). A native arm64 build is Release (-O3) as everywhere.
  cmake -S . -B "$B" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Emulated \
    -DCMAKE_CXX_FLAGS_EMULATED="${MOE_ARM64_OPT:--O1}" \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON "${launcher[@]}" >/dev/null
  cmake --build "$B" -j "${MOE_JOBS:-2}" --target moe
  cmake --build "$B" -j "${MOE_JOBS:-2}" --target moe_tests
  echo "arm64.sh: build took $(($(date +%s) - start)) s"
  ;;
test)
  need
  cpu=${2:?CPU model}
  filter=${3:-*}
  start=$(date +%s)
  export QEMU_CPU=$cpu
  "$qemu" "$B/moe" info
  "$qemu" "$B/moe_tests" --gtest_filter="$filter" --gtest_brief=1
  echo "arm64.sh: moe_tests under qemu -cpu $cpu took $(($(date +%s) - start)) s"
  ;;
step)
  need
  cpu=${2:?CPU model}
  export QEMU_CPU=$cpu
  bash tests/arm64/step_compare.sh "$qemu $B/moe" "${MOE_HOST_BUILD:-build}/moe"
  ;;
*)
  sed -n '2,13p' "$0"
  exit 2
  ;;
esac
