#!/usr/bin/env bash
# Runs ulysses-train under mpirun on this machine: scripts/launch.sh NP CONFIG [trainer args],
# or scripts/launch.sh NP CONFIG eval [eval args] to evaluate on the same mesh
# (docs/evaluation.md). As root, and with more ranks than cores, mpirun needs to be told
# that this is intended. CONFIG and the paths in it are read from where you run it, as
# mpirun itself would read them.
set -euo pipefail
usage="usage: scripts/launch.sh NUM_RANKS CONFIG.yaml [eval] [--set key=value ...]"
if [ $# -lt 2 ]; then
  echo "$usage" >&2
  exit 2
fi
ranks=$1
config=$2
shift 2
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
  echo "launch.sh: NUM_RANKS must be a positive whole number, got '$ranks'" >&2
  echo "$usage" >&2
  exit 2
fi
train="$(cd "$(dirname "$0")/.." && pwd)/build/apps/ulysses-train"
if [ ! -x "$train" ]; then
  echo "launch.sh: $train is missing; run scripts/setup.sh first" >&2
  exit 2
fi
command=()
if [ $# -gt 0 ] && [ "$1" = eval ]; then
  command=(eval)
  shift
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
exec mpirun -np "$ranks" --bind-to none "$train" "${command[@]}" --config "$config" "$@"
