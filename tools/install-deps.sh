#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the project builds with, only those that are missing.
# The CUDA toolkit is optional: without nvcc the CPU parts build and the GPU tests are absent.
set -euo pipefail
pkgs=(cmake ninja-build g++ clang-format libeigen3-dev libgtest-dev librapidcheck-dev libhdf5-dev
      libcli11-dev libfmt-dev nlohmann-json3-dev python3-numpy python3-h5py python3-matplotlib
      python3-torch python3-pytest python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: no nvcc found: the CUDA library and GPU tests will not be built"
fi
