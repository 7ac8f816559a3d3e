#!/usr/bin/env bash
# Installs memtrain's build dependencies from Debian 12 packages. Idempotent: when every package is
# already installed it touches nothing and needs neither root nor the network. CUDA is never installed;
# the build uses it when /usr/local/cuda/bin/nvcc exists.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# GCC's libgomp comes with g++, so OpenMP needs no extra package. oneDNN's CMake package requires OpenCL
# (ocl-icd-opencl-dev is only "recommended" by libdnnl-dev); without it find_package(dnnl) fails and the
# build would quietly fall back to Eigen.
packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev libfmt-dev libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev libopenblas-dev zlib1g-dev
  libgtest-dev libbenchmark-dev libcli11-dev
  # MPI: data-parallel runs (dist::world() under mpirun) and their tests (memtrain_dist_tests).
  openmpi-bin libopenmpi-dev
  # Data: the GPT example's default corpus and the CNN example's data set (tests skip without them).
  fortunes dataset-fashion-mnist
)

mt_step "setup: checking ${#packages[@]} Debian packages"
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "all installed: ${packages[*]}"
else
  echo "missing: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    mt_die "installing packages needs root; run as root (or with sudo): bash scripts/setup.sh"
  fi
  export DEBIAN_FRONTEND=noninteractive
  mt_run apt-get update
  mt_run apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "CUDA: $(/usr/local/cuda/bin/nvcc --version | tail -n 1) at /usr/local/cuda; the CUDA backend will be built"
else
  echo "CUDA: no /usr/local/cuda/bin/nvcc; building the CPU backend only (CUDA is never installed by this script)"
fi
