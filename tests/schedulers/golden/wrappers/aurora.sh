#!/bin/bash
# hpcring GPU selection for mpiexec ranks, profile aurora: generated from the rank mapping.
# Local rank i sees only its own devices through ZE_AFFINITY_MASK; the command follows as arguments.
set -euo pipefail
local_rank="${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:-${MPI_LOCALRANKID:-}}}"
case "$local_rank" in
  0) devices=0.0 ;;
  1) devices=0.1 ;;
  2) devices=1.0 ;;
  3) devices=1.1 ;;
  4) devices=2.0 ;;
  5) devices=2.1 ;;
  6) devices=3.0 ;;
  7) devices=3.1 ;;
  8) devices=4.0 ;;
  9) devices=4.1 ;;
  10) devices=5.0 ;;
  11) devices=5.1 ;;
  *)
    echo 'hpcring: no GPU for this rank: the local rank (PALS_LOCAL_RANKID, PMI_LOCAL_RANK, MPI_LOCALRANKID) is unset or beyond the mapping'"'"'s ranks per node:' "'$local_rank'" >&2
    exit 2
    ;;
esac
export ZE_AFFINITY_MASK="$devices"
exec "$@"
