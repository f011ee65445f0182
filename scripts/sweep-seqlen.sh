#!/usr/bin/env bash
# Sequence-length sweep (see scripts/sweep_seqlen.py --help), e.g.
#   scripts/sweep-seqlen.sh --seq-lens 256,1024,4096 --sp 1,2,4 --zero 0,1 --out sweep
#   scripts/sweep-seqlen.sh --budget-gib 0.5 --sp 1,4 --checkpointing none,layer
# Paths (--config, --out, those in the config) are read from where it runs, as the trainer's.
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/sweep_seqlen.py" "$@"
