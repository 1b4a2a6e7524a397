#!/usr/bin/env bash
# Installs the Debian 12 packages the engine needs (build, tests, MPI, oneDNN, fuzzing and
# sanitizers, the Python package with PyTorch, the example's text corpus).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin iproute2
      # a private single-machine Slurm on the namespace cluster (scripts/cluster.sh up --slurm, CTest
      # cluster_srun): srun --mpi=pmix and the batch script tested as users run them on a real cluster
      slurmctld slurmd slurm-client munge
      # fuzzing and the address/undefined-behaviour sanitizers (libFuzzer and the runtimes)
      clang libclang-rt-14-dev llvm
      # the Python package and its PyTorch layer; OpenBLAS so that torch's own matmul is fair
      python3 python3-dev python3-pybind11 pybind11-dev python3-numpy python3-torch
      libopenblas0-pthread python3-mpi4py python3-pytest
      # PyTorch at its best in the comparisons (docs/python_benchmarks.md, Headline: preloaded
      # tcmalloc; with glibc's malloc its blocks fault in every large tensor)
      libtcmalloc-minimal4
      # type-checks the package's stubs (tests/python/test_stubs.py; that test is skipped without it)
      python3-mypy
      # real English text for examples/tiny_mixtral.py
      fortunes
      # the AArch64 cross build and its runs under emulation (scripts/arm64.sh, CTest arm64_*):
      # Debian's cross toolchain, user-mode qemu, and GoogleTest for arm64 (multiarch: installs
      # beside the amd64 package)
      crossbuild-essential-arm64 qemu-user libgtest-dev:arm64)
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
update=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
  update=1
fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  update=0
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# yaml-cpp for arm64: libyaml-cpp-dev:arm64 does not install beside the amd64 package (it would
# remove it), so its two .debs are unpacked into /opt/moe-arm64, where cmake/aarch64-linux-gnu.cmake
# looks. (libopenmpi-dev:arm64 would remove the amd64 MPI too: the cross build has no MPI.)
arm64_deps=${MOE_ARM64_DEPS:-/opt/moe-arm64}
if [ ! -f "$arm64_deps/usr/lib/aarch64-linux-gnu/cmake/yaml-cpp/yaml-cpp-config.cmake" ]; then
  ((update)) && $SUDO apt-get update -qq
  tmp=$(mktemp -d)
  chmod 777 "$tmp"  # apt-get download runs as _apt
  (cd "$tmp" && apt-get download -qq libyaml-cpp-dev:arm64 libyaml-cpp0.7:arm64)
  $SUDO mkdir -p "$arm64_deps"
  for deb in "$tmp"/*.deb; do $SUDO dpkg -x "$deb" "$arm64_deps"; done
  rm -rf "$tmp"
fi
