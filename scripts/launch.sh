#!/usr/bin/env bash
# Runs ulysses-train under mpirun on this machine: scripts/launch.sh NP CONFIG [trainer args],
# or scripts/launch.sh NP CONFIG eval [eval args] to evaluate on the same mesh
# (docs/evaluation.md). As root, and with more ranks than cores, mpirun needs to be told
# that this is intended.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/launch.sh NUM_RANKS CONFIG.yaml [eval] [--set key=value ...]" >&2
  exit 2
fi
ranks=$1
config=$2
shift 2
command=()
if [ $# -gt 0 ] && [ "$1" = eval ]; then
  command=(eval)
  shift
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
exec mpirun -np "$ranks" --bind-to none build/apps/ulysses-train "${command[@]}" --config "$config" "$@"
