#!/bin/bash
# hpcring GPU selection for mpiexec ranks, profile generic-pbs: generated from the rank mapping.
# Local rank i sees only its own devices through CUDA_VISIBLE_DEVICES; the command follows as arguments.
set -euo pipefail
local_rank="${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:-${MPI_LOCALRANKID:-}}}"
case "$local_rank" in
  0) devices=0 ;;
  1) devices=1 ;;
  2) devices=2 ;;
  3) devices=3 ;;
  *)
    echo 'hpcring: no GPU for this rank: the local rank (PALS_LOCAL_RANKID, PMI_LOCAL_RANK, MPI_LOCALRANKID) is unset or beyond the mapping'"'"'s ranks per node:' "'$local_rank'" >&2
    exit 2
    ;;
esac
export CUDA_VISIBLE_DEVICES="$devices"
exec "$@"
