#!/usr/bin/env bash
# Installs the Debian 12 packages the engine needs (build, tests, MPI, oneDNN).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin iproute2)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
