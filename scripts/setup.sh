#!/usr/bin/env bash
# Installs the Debian packages ulysses needs (skipped when all are present) and builds it
# in Release into build/. Usage: scripts/setup.sh [extra cmake arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config git
          openmpi-bin libopenmpi-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
          libopenblas-dev nlohmann-json3-dev libgtest-dev
          libopenblas0-openmp   # the GEMMs on the kernels' OpenMP threads (docs/performance.md)
          libopenblas0-pthread  # python3-torch's, 10x faster than the serial build
          python3 python3-torch gnuplot-nox
          clang libclang-rt-14-dev libomp-dev)  # scripts/fuzz.sh: libFuzzer, sanitizers, OpenMP
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$jobs"
echo "setup: built build/apps/ulysses-train"
