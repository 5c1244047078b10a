#!/bin/bash
# hpcring GPU selection for srun ranks, profile lumi-g: generated from the rank mapping.
# Local rank i sees only its own devices through ROCR_VISIBLE_DEVICES; the command follows as arguments.
set -euo pipefail
local_rank="${SLURM_LOCALID:-}"
case "$local_rank" in
  0) devices=0 ;;
  1) devices=1 ;;
  2) devices=2 ;;
  3) devices=3 ;;
  4) devices=4 ;;
  5) devices=5 ;;
  6) devices=6 ;;
  7) devices=7 ;;
  *)
    echo 'hpcring: no GPU for this rank: the local rank (SLURM_LOCALID) is unset or beyond the mapping'"'"'s ranks per node:' "'$local_rank'" >&2
    exit 2
    ;;
esac
export ROCR_VISIBLE_DEVICES="$devices"
exec "$@"
