#!/usr/bin/env bash
# Verify the engine's GPU data plane on a GPU node: what CI (no GPU) cannot run.
#
#   benchmarks/gpu_check.sh                 # one rank per visible GPU of this node
#   NP=2 benchmarks/gpu_check.sh            # fewer ranks (never more than GPUs: NCCL refuses shared GPUs)
#   PYTHON=/path/to/python benchmarks/gpu_check.sh
#
# Needs a CUDA build of torch (torch.distributed with NCCL) and the launcher's MPI in the same environment.
# Steps (each under a timeout; the script stops at the first failure):
#   1. tests/ranked/device_plane with CUDA tensors (HPCRING_TEST_DEVICE=cuda): every rank on its own GPU,
#      every op through NCCL, DistributedOptimizer weights equal to the host path's, the timeline;
#   2. with 4+ ranks: the same on 2 emulated nodes with the hierarchical allreduce forced (NCCL
#      reduce-scatter/allgather inside a node, the shard across nodes over MPI from pinned host memory, and
#      over NCCL with HPCRING_DEVICE_CROSS=nccl);
#   3. the NCCL transport against the Transport contract (tests/ranked/torch_ops/test_torch_ops_transport.py);
#   4. timing: a 64 MiB float32 allreduce through the engine vs torch.distributed.all_reduce on NCCL
#      (benchmarks/bench_device_plane.py; medians, ratio to torch.distributed), flat and, with 4+ ranks, on
#      2 emulated nodes with the hierarchical route.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT=${TIMEOUT:-900}

NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$NGPU" -lt 1 ]; then
    echo "gpu_check: torch sees no CUDA device; run this on a GPU node with a CUDA build of torch" >&2
    exit 2
fi
"$PY" -c 'import torch.distributed as d, sys; sys.exit(0 if d.is_available() and d.is_nccl_available() else 1)' || {
    echo "gpu_check: this torch has no NCCL (torch.distributed.is_nccl_available() is False)" >&2
    exit 2
}
NP=${NP:-$NGPU}
if [ "$NP" -gt "$NGPU" ]; then
    echo "gpu_check: NP=$NP but only $NGPU GPUs: NCCL needs one GPU per rank" >&2
    exit 2
fi

if [ "$NP" -lt 2 ]; then
    # NCCL refuses two ranks on one GPU, and at one rank the device plane takes its one-rank shortcuts.
    echo "gpu_check: NOTE: 1 rank ($NGPU GPU visible): no NCCL collective runs between ranks. Steps 1 and 4" \
        "check CUDA tensor handling (routes, streams, staging, results on their device) and step 3 the NCCL" \
        "transport on a one-rank communicator; NCCL between ranks needs 2+ GPUs." >&2
fi

run() { timeout -k 10 "$LIMIT" "$PY" -m hpcring run -np "$NP" "$@"; }
ranked() { run "$@" -- "$PY" -m pytest -q -x -p no:cacheprovider -rs -W ignore::UserWarning tests/ranked/device_plane; }
export HPCRING_RANKED=1 HPCRING_TEST_DEVICE=cuda
two_nodes=0
if [ "$NP" -ge 4 ] && [ $((NP % 2)) -eq 0 ]; then two_nodes=1; fi

echo "== 1. device plane tests: CUDA tensors, NCCL, $NP ranks on one node"
ranked

if [ "$two_nodes" = 1 ]; then
    echo "== 2. the same on 2 emulated nodes, hierarchical allreduce forced"
    HPCRING_ALLREDUCE_ALGORITHM=hierarchical ranked --emulate-nodes 2
else
    echo "== 2. skipped: the hierarchical route needs 4+ ranks (an even number); NP=$NP"
fi

echo "== 3. NCCL transport contract"
HPCRING_TEST_TRANSPORT=nccl run -- "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/ranked/torch_ops/test_torch_ops_transport.py

echo "== 4. 64 MiB allreduce: engine (device plane) vs torch.distributed.all_reduce, NCCL"
run -- "$PY" benchmarks/bench_device_plane.py --device cuda --size 64M --json gpu-check-flat.json
if [ "$two_nodes" = 1 ]; then
    HPCRING_ALLREDUCE_ALGORITHM=hierarchical run --emulate-nodes 2 -- \
        "$PY" benchmarks/bench_device_plane.py --device cuda --size 64M --json gpu-check-hierarchical.json
fi
if [ "$NP" -lt 2 ]; then
    echo "gpu_check: all steps passed at 1 rank; NCCL between ranks NOT verified (needs 2+ GPUs)"
else
    echo "gpu_check: all steps passed"
fi
