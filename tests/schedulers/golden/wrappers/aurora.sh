#!/bin/bash
# hpcring GPU selection for mpiexec ranks, profile aurora: generated from the rank mapping.
# Local rank i sees only its own devices through ZE_AFFINITY_MASK; the command follows as arguments.
set -euo pipefail
local_rank="${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:-${MPI_LOCALRANKID:-}}}"
case "$local_rank" in
  0) devices=0 ;;
  1) devices=1 ;;
  2) devices=2 ;;
  3) devices=3 ;;
  4) devices=4 ;;
  5) devices=5 ;;
  6) devices=6 ;;
  7) devices=7 ;;
  8) devices=8 ;;
  9) devices=9 ;;
  10) devices=10 ;;
  11) devices=11 ;;
  *)
    echo 'hpcring: no GPU for this rank: the local rank (PALS_LOCAL_RANKID, PMI_LOCAL_RANK, MPI_LOCALRANKID) is unset or beyond the mapping'"'"'s ranks per node:' "'$local_rank'" >&2
    exit 2
    ;;
esac
export ZE_FLAT_DEVICE_HIERARCHY=FLAT
export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1
export ZE_AFFINITY_MASK="$devices"
exec "$@"
