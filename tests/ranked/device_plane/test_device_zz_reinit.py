"""Tests that re-initialise hpcring with other settings (run last; each restores the launch's settings):

- DistributedOptimizer training through the device plane gives the weights of the same training on the host
  path (numpy + MPI), to float tolerance;
- HPCRING_DEVICE_CROSS=nccl: the hierarchical cross-node stage through the device backend instead of MPI;
- the host path's pipelined hierarchical allreduce reports its three stages to the timeline too.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from device_cases import (
    CUDA,
    DEVICE,
    ROUTE,
    STAGES,
    check_stages_nested,
    hierarchical_forced,
    plane_stats,
    record,
    reinit,
)

STEPS, BATCH = 5, 4


def train(hvd: ModuleType, device: torch.device, steps: int = STEPS) -> list[torch.Tensor]:
    """`steps` SGD-with-momentum steps of a small MLP on this rank's shard; the weights afterwards (CPU)."""
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(steps * n * BATCH, 6, generator=gen)
    y = torch.randint(0, 3, (steps * n * BATCH,), generator=gen)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for s in range(steps):
        lo = (s * n + r) * BATCH
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(x[lo : lo + BATCH].to(device)), y[lo : lo + BATCH].to(device)
        )
        loss.backward()
        opt.step()
    return [p.detach().cpu().clone() for p in model.parameters()]


def test_distributed_optimizer_matches_the_host_path(hvd: ModuleType) -> None:
    before = plane_stats()["batches"]
    on_device = train(hvd, DEVICE)
    assert plane_stats()["batches"] > before  # the gradients took the device plane
    launch = os.environ.get("HPCRING_CPU_DEVICE_PLANE", "")
    try:
        reinit(hvd, HPCRING_CPU_DEVICE_PLANE="off")
        on_host = train(hvd, torch.device("cpu"))
        assert plane_stats()["batches"] == 0  # the host path never built a device plane
    finally:
        reinit(hvd, HPCRING_CPU_DEVICE_PLANE=launch)
    moved = max(float((a - b).abs().max()) for a, b in zip(on_device, train_reference(), strict=True))
    assert moved > 1e-3  # training did change the weights (the comparison below is not vacuous)
    for a, b in zip(on_device, on_host, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def train_reference() -> list[torch.Tensor]:
    """The untrained weights, for the 'something happened' check."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return [p.detach().clone() for p in model.parameters()]


def test_cross_node_stage_through_the_device_backend(hvd: ModuleType) -> None:
    if not hierarchical_forced():
        pytest.skip("needs several emulated nodes and HPCRING_ALLREDUCE_ALGORITHM=hierarchical")
    if ROUTE.endswith("+mpi"):
        pytest.skip("the MPI route stages whole batches; HPCRING_DEVICE_CROSS is the process-group route's")
    n, r = hvd.size(), hvd.rank()
    launch = os.environ.get("HPCRING_DEVICE_CROSS", "")
    try:
        reinit(hvd, HPCRING_DEVICE_CROSS="nccl")
        y = hvd.allreduce(torch.full((1001,), float(r + 1), device=DEVICE), op=hvd.Average, name="x.avg")
        assert torch.allclose(y.cpu(), torch.full((1001,), (n + 1) / 2))
        outs = hvd.grouped_allreduce(
            [torch.full((k * 100 + 1,), r + k, dtype=torch.int64, device=DEVICE) for k in range(4)],
            op=hvd.Sum,
            name="x.fused",
        )
        for k, o in enumerate(outs):
            assert o.cpu().tolist() == [n * k + n * (n - 1) // 2] * (k * 100 + 1)
        stats = plane_stats()
        assert stats["hierarchical"] == 2 and stats["cross_nccl"] == 2 and stats.get("cross_mpi", 0) == 0
    finally:
        reinit(hvd, HPCRING_DEVICE_CROSS=launch)


def test_host_hierarchical_stages_in_the_timeline(hvd: ModuleType, comm: Any, shared_tmp: Path) -> None:
    """The numpy path: small buffers run the stages one after another, large ones pipelined over 2 MiB
    segments, where the stages overlap (each on its own track, so the trace stays valid)."""
    if not hierarchical_forced():
        pytest.skip("needs several emulated nodes and HPCRING_ALLREDUCE_ALGORITHM=hierarchical")
    if CUDA:
        pytest.skip("the host path's stages are checked in the CPU run")
    n, r = hvd.size(), hvd.rank()
    launch = os.environ.get("HPCRING_CPU_DEVICE_PLANE", "")
    big = 3 << 20  # float32 elements: 12 MiB, 6 segments

    def work() -> None:
        small = hvd.allreduce(torch.full((1000,), float(r)), op=hvd.Sum, name="host.small")
        large = hvd.allreduce(torch.full((big,), float(r)), op=hvd.Sum, name="host.large")
        assert small[0].item() == large[-1].item() == n * (n - 1) / 2

    try:
        reinit(hvd, HPCRING_CPU_DEVICE_PLANE="off")
        events = record(hvd, comm, shared_tmp, "host", work)
        assert plane_stats()["batches"] == 0
    finally:
        reinit(hvd, HPCRING_CPU_DEVICE_PLANE=launch)
    if events is None:
        return
    check_stages_nested(events, "allreduce.host.small", STAGES)
    stages = check_stages_nested(events, "allreduce.host.large", STAGES)
    if hvd.local_size() > 1:  # pipelined: the cross stage starts before the node stage has done every segment
        assert stages["CROSS_ALLREDUCE"][0] < stages["INTRA_REDUCE_SCATTER"][1], stages


def test_ranks_on_different_routes_fail_on_every_rank(hvd: ModuleType) -> None:
    """Rank 0 on the host path, the others on the device route: a validation error naming the devices on
    every rank (never a hang with half the ranks in MPI and half in a process group), then normal service."""
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two ranks")
    launch = os.environ.get("HPCRING_CPU_DEVICE_PLANE", "")
    others = "cuda" if CUDA else r"cpu\+gloo"
    expected = rf"device: rank 0 has cpu; ranks? [\d, ]+ ha(s|ve) {others}"
    try:
        if CUDA:  # rank 0 hands over a CPU tensor, the others CUDA tensors
            t = torch.ones(3) if r == 0 else torch.ones(3, device=DEVICE)
        else:  # rank 0 keeps CPU tensors on the host path, the others route them through gloo
            reinit(hvd, HPCRING_CPU_DEVICE_PLANE="off" if r == 0 else "gloo")
            t = torch.ones(3)
        with pytest.raises(hvd.HorovodInternalError, match=expected):
            hvd.allreduce(t, name="mismatch")
    finally:
        if not CUDA:
            reinit(hvd, HPCRING_CPU_DEVICE_PLANE=launch)
    after = hvd.allreduce(torch.ones(2, device=DEVICE), op=hvd.Sum, name="after")
    assert after.cpu().tolist() == [float(n)] * 2


def test_lanes_take_batches_in_turn(hvd: ModuleType) -> None:
    """HOROVOD_NUM_NCCL_STREAMS=2: batches alternate between two lanes, each with process groups of its own
    (built when first needed), and the results are those of one lane."""
    if ROUTE.endswith("+mpi") or hierarchical_forced():
        pytest.skip("the lanes' own process groups are those of the flat process-group route")
    n, r = hvd.size(), hvd.rank()
    launch = os.environ.get("HOROVOD_NUM_NCCL_STREAMS", "")
    try:
        reinit(hvd, HOROVOD_NUM_NCCL_STREAMS="2")
        for k in range(4):
            y = hvd.allreduce(torch.full((k + 2,), float(r + k), device=DEVICE), op=hvd.Sum, name=f"lane.{k}")
            assert torch.equal(y.cpu(), torch.full((k + 2,), float(n * (n - 1) // 2 + n * k)))
        stats = plane_stats()
        assert stats["batches"] == 4 and stats.get("groups_world", 0) == (2 if n > 1 else 0), stats
    finally:
        reinit(hvd, HOROVOD_NUM_NCCL_STREAMS=launch)


def test_gpu_operations_choose_the_route_per_op(hvd: ModuleType) -> None:
    """CUDA: HOROVOD_GPU_ALLREDUCE=MPI sends allreduces over the MPI route and leaves the other ops on
    NCCL; every rank agrees (the route is part of the signature)."""
    if not CUDA:
        pytest.skip("the GPU routes are chosen for CUDA tensors")
    from hpcring.engine.request import OpType
    from hpcring.torch import tensors

    n, r = hvd.size(), hvd.rank()
    launch = os.environ.get("HOROVOD_GPU_ALLREDUCE", "")
    try:
        reinit(hvd, HOROVOD_GPU_ALLREDUCE="MPI")
        tensors._routes.clear()
        x = torch.full((9,), float(r), device=DEVICE)
        assert tensors._view(x, OpType.ALLREDUCE).device == "cuda+mpi"
        assert tensors._view(x, OpType.ALLGATHER).device == ROUTE
        y = hvd.allreduce(x, op=hvd.Sum, name="gpu.mpi")
        assert torch.equal(y.cpu(), torch.full((9,), float(n * (n - 1) // 2)))
        assert plane_stats()["staged"] >= 1
    finally:
        tensors._routes.clear()
        reinit(hvd, HOROVOD_GPU_ALLREDUCE=launch)
