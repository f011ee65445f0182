#!/usr/bin/env bash
# Sequence-length sweep (see scripts/sweep_seqlen.py --help), e.g.
#   scripts/sweep-seqlen.sh --seq-lens 256,1024,4096 --sp 1,2,4 --zero 0,1 --out sweep
#   scripts/sweep-seqlen.sh --budget-gib 0.5 --sp 1,4 --checkpointing none,layer
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/sweep_seqlen.py "$@"
