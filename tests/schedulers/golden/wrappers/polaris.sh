#!/bin/bash
# hpcring GPU selection for mpiexec ranks, profile polaris: generated from the rank mapping.
# Local rank i sees only its own devices through CUDA_VISIBLE_DEVICES; the command follows as arguments.
set -euo pipefail
local_rank="${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:-${MPI_LOCALRANKID:-}}}"
case "$local_rank" in
  0) devices=3 ;;
  1) devices=2 ;;
  2) devices=1 ;;
  3) devices=0 ;;
  *)
    echo 'hpcring: no GPU for this rank: the local rank (PALS_LOCAL_RANKID, PMI_LOCAL_RANK, MPI_LOCALRANKID) is unset or beyond the mapping'"'"'s ranks per node:' "'$local_rank'" >&2
    exit 2
    ;;
esac
export CUDA_VISIBLE_DEVICES="$devices"
exec "$@"
