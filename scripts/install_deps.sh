#!/usr/bin/env bash
# Installs the Debian 12 packages the engine needs (build, tests, MPI, oneDNN, fuzzing and
# sanitizers, the Python package with PyTorch, the example's text corpus).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin iproute2
      # fuzzing and the address/undefined-behaviour sanitizers (libFuzzer and the runtimes)
      clang libclang-rt-14-dev llvm
      # the Python package and its PyTorch layer; OpenBLAS so that torch's own matmul is fair
      python3 python3-dev python3-pybind11 pybind11-dev python3-numpy python3-torch
      libopenblas0-pthread python3-mpi4py python3-pytest
      # type-checks the package's stubs (tests/python/test_stubs.py; that test is skipped without it)
      python3-mypy
      # real English text for examples/tiny_mixtral.py
      fortunes)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
