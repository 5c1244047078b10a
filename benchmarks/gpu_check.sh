#!/usr/bin/env bash
# The GPU proof: what CI (no GPU) cannot run, in one run of a few minutes on a machine with one GPU or more.
#
#   benchmarks/gpu_check.sh                       # logs and JSON into gpu-check/ (LOG_DIR to change)
#   PYTHON=/path/to/python benchmarks/gpu_check.sh
#   DEVICE=cpu benchmarks/gpu_check.sh            # dry run of every step on the CPU stand-ins (gloo, MPI)
#
# Needs a CUDA build of torch with NCCL and the project's MPI (mpi4py + its mpiexec) in the same environment
# (../shared/recipes/gpu-device.md brings them to a bare machine). Every step runs under a timeout; a failed
# step is reported and the next one still runs; the exit code is non-zero when any step failed.
#   1. NG ranks, one GPU each (NG = the GPUs visible): the device-plane tests with CUDA tensors over NCCL
#      (results, streams and events, DistributedOptimizer equal to one process on the global batch);
#   2. the NCCL transport against the Transport contract;
#   3. per op at 1 rank: 4 B, 1 MiB and 64 MiB allreduce_ against torch.distributed.all_reduce (NCCL);
#   4. 2 ranks on 2 emulated nodes, one GPU: the hierarchical route (one rank per node: the shard crosses
#      nodes over MPI from pinned host memory; no NCCL group spans the two ranks): the device-plane tests;
#   5. 2 ranks on one node and one GPU over the MPI route (HOROVOD_GPU_OPERATIONS=MPI): the device-plane
#      tests, and per op against torch.distributed with gloo on the same CUDA tensors;
#   6. overlap, 2 ranks on one GPU over both routes: the ResNet-style and transformer steps against the
#      same model with no communication, and the share of communication time hidden under backward (CUDA
#      timing events; Chrome traces in the log folder);
#   7. DistributedOptimizer against DDP (NCCL) at 1 rank, on the four benchmark models (at one rank hpcring
#      skips reduction and DDP does not: printed beside the figures);
#   8. op=Adasum on CUDA tensors against the NumPy reference (tests/ranked/adasum): 2 ranks on 2 emulated
#      nodes over NCCL (Horovod's hierarchical form, one rank per node: the cross-node Adasum over MPI from
#      pinned host memory) and 2 ranks over the MPI route.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-.venv/bin/python}
LIMIT=${TIMEOUT:-150}
LOG=${LOG_DIR:-gpu-check}
DEV=${DEVICE:-cuda}
mkdir -p "$LOG"

if [ "$DEV" = cpu ]; then
    # The same steps on CPU tensors: gloo stands in for NCCL and HPCRING_CPU_DEVICE_PLANE=mpi for the MPI
    # route; what differs on a GPU (streams, events, pinned memory, NCCL itself) is not exercised.
    NG=2 GROUP=gloo MPI_ROUTE=(HPCRING_CPU_DEVICE_PLANE=mpi) NCCL_ROUTE=(HPCRING_CPU_DEVICE_PLANE=gloo)
    export HPCRING_TEST_TRANSPORT=gloo
else
    NG=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
    if [ "$NG" -lt 1 ]; then
        echo "gpu_check: torch sees no CUDA device; run it on a GPU machine with a CUDA build of torch" >&2
        exit 2
    fi
    if ! "$PY" -c 'import torch.distributed as d, sys; sys.exit(not (d.is_available() and d.is_nccl_available()))'; then
        echo "gpu_check: this torch has no NCCL (torch.distributed.is_nccl_available() is False)" >&2
        exit 2
    fi
    GROUP=nccl MPI_ROUTE=(HOROVOD_GPU_OPERATIONS=MPI) NCCL_ROUTE=(HOROVOD_GPU_OPERATIONS=NCCL)
    export HPCRING_TEST_TRANSPORT=nccl
fi
export HPCRING_RANKED=1 HPCRING_TEST_DEVICE="$DEV" PYTHONUNBUFFERED=1
failed=()
step() {  # step NAME NP ROUTE_VAR=VALUE [launcher flags...] -- command...
    local name=$1 np=$2 route=$3 start rc
    shift 3
    start=$(date +%s)
    echo "== $name ($np ranks, $route)"
    env "$route" timeout -k 10 "$LIMIT" "$PY" -m hpcring run -np "$np" "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    tail -n 25 "$LOG/$name.log"
    echo "-- $name: exit $rc after $(($(date +%s) - start)) s"
    if [ "$rc" -ne 0 ]; then failed+=("$name"); fi
}
tests=("$PY" -m pytest -q -x -p no:cacheprovider -rs -W ignore::UserWarning tests/ranked/device_plane)
plane=benchmarks/bench_device_plane.py
steps=benchmarks/bench_gpu_step.py
two=(--emulate-nodes 2)

step 1-device-plane-"$GROUP" "$NG" "${NCCL_ROUTE[@]}" -- "${tests[@]}"
step 2-transport-"$GROUP" "$NG" "${NCCL_ROUTE[@]}" -- "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/ranked/torch_ops/test_torch_ops_transport.py
step 3-per-op-1-rank 1 "${NCCL_ROUTE[@]}" -- "$PY" "$plane" --device "$DEV" --sizes 4,1M,64M --repeats 40 \
    --json "$LOG/per-op-1-rank.json"
step 4-hierarchical-2-nodes 2 HPCRING_ALLREDUCE_ALGORITHM=hierarchical "${two[@]}" -- \
    env "${NCCL_ROUTE[@]}" "${tests[@]}"
step 5a-mpi-route 2 "${MPI_ROUTE[@]}" -- "${tests[@]}"
step 5b-per-op-mpi-route 2 "${MPI_ROUTE[@]}" -- "$PY" "$plane" --device "$DEV" --sizes 4,1M,64M --peer gloo \
    --repeats 20 --json "$LOG/per-op-mpi-route.json"
step 6a-overlap-hierarchical 2 HPCRING_ALLREDUCE_ALGORITHM=hierarchical "${two[@]}" -- env "${NCCL_ROUTE[@]}" \
    "$PY" "$steps" --device "$DEV" --models resnet,transformer --json "$LOG/overlap-hierarchical.json" \
    --trace "$LOG/overlap-hierarchical.trace.json"
step 6b-overlap-mpi-route 2 "${MPI_ROUTE[@]}" -- "$PY" "$steps" --device "$DEV" --models resnet,transformer \
    --json "$LOG/overlap-mpi-route.json" --trace "$LOG/overlap-mpi-route.trace.json"
step 7-optimizer-vs-ddp-1-rank 1 "${NCCL_ROUTE[@]}" -- "$PY" "$steps" --device "$DEV" \
    --models mlp,mlp200,resnet,transformer --ddp "$GROUP" --trace-steps 0 --json "$LOG/optimizer-vs-ddp-1-rank.json"
adasum=("$PY" -m pytest -q -x -p no:cacheprovider -rs -W ignore::UserWarning tests/ranked/adasum/test_adasum_allreduce.py
    tests/ranked/adasum/test_adasum_optimizer.py)
step 8a-adasum-2-nodes 2 "${NCCL_ROUTE[@]}" "${two[@]}" -- "${adasum[@]}"
step 8b-adasum-mpi-route 2 "${MPI_ROUTE[@]}" -- "${adasum[@]}"

if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]} (logs in $LOG/)"
    exit 1
fi
echo "gpu_check: every step passed (logs and figures in $LOG/)"
