#!/usr/bin/env bash
# Installs the Debian packages ulysses needs (skipped when all are present) and builds it in
# Release into build/.
# Usage: scripts/setup.sh [--all] [extra cmake arguments]
#   without --all: what the trainer needs, and the trainer alone (build/apps/ulysses-train),
#                  so a first run spends its time on the job, not on building tests;
#   --all:         also the test and benchmark tools (PyTorch, clang's libFuzzer) and every
#                  binary: the tests, benchmarks and fuzzers (scripts/test.sh passes it).
set -euo pipefail
cd "$(dirname "$0")/.."

everything=false
if [ $# -gt 0 ] && [ "$1" = --all ]; then
  everything=true
  shift
fi

packages=(build-essential cmake pkg-config git
          openmpi-bin libopenmpi-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
          libopenblas-dev nlohmann-json3-dev
          libgtest-dev          # the tests' CMake files are configured with the trainer
          libopenblas0-openmp   # the GEMMs on the kernels' OpenMP threads (docs/performance.md)
          python3 gnuplot-nox)  # scripts/sweep_seqlen.py, scripts/plot-trace.py
if $everything; then
  packages+=(libopenblas0-pthread  # python3-torch's, 10x faster than the serial build
             python3-torch          # the PyTorch reference tests and baselines
             clang libclang-rt-14-dev libomp-dev)  # scripts/fuzz.sh: libFuzzer, sanitizers, OpenMP
fi
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
if $everything; then
  cmake --build build -j"$jobs"
  echo "setup: built build/apps/ulysses-train, the tests and the benchmarks"
else
  cmake --build build -j"$jobs" --target ulysses-train
  echo "setup: built build/apps/ulysses-train (scripts/setup.sh --all builds the tests too)"
fi
