"""Shared helpers of the device-plane ranked tests: the device under test and the engine's counters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

CUDA = os.environ.get("HPCRING_TEST_DEVICE", "cpu") == "cuda"


def _cuda_index() -> int:
    """cuda:LOCAL_RANK, or cuda:RANK when nodes are emulated on one machine (LOCAL_RANK then counts within an
    emulated node), modulo the GPU count: with fewer GPUs than ranks, ranks share one, which the MPI route and
    the hierarchical route with one rank per node allow (NCCL refuses two ranks of one group on one GPU)."""
    key = "RANK" if os.environ.get("HPCRING_EMULATE_NODES") else "LOCAL_RANK"
    return int(os.environ.get(key, "0")) % torch.cuda.device_count()


DEVICE = torch.device("cuda", _cuda_index()) if CUDA else torch.device("cpu")


def _route() -> str:
    """The agreed signature device of this launch's tensors: CUDA over NCCL, or over MPI when the launch
    asks for it (HOROVOD_GPU_OPERATIONS=MPI); CPU tensors through the stand-in HPCRING_CPU_DEVICE_PLANE
    names (gloo unless the launch set mpi)."""
    if CUDA:
        ops = os.environ.get("HPCRING_GPU_OPERATIONS") or os.environ.get("HOROVOD_GPU_OPERATIONS") or "nccl"
        return "cuda" if ops.lower() == "nccl" else "cuda+mpi"
    return "cpu+" + os.environ.get("HPCRING_CPU_DEVICE_PLANE", "gloo")


ROUTE = _route()
MPI_ROUTE = f"{DEVICE.type}+mpi"  # the route that stages through host memory and reduces over MPI


def plane_stats() -> dict[str, int]:
    """The device plane's counters (all zero before its first batch)."""
    from hpcring.torch import basics

    plane: Any = basics.engine().device_plane
    if plane is None:
        return {"batches": 0, "hierarchical": 0, "planes": 0, "released": 0, "staged": 0}
    return dict(plane.stats)


def hierarchical_forced() -> bool:
    """Launched with HPCRING_ALLREDUCE_ALGORITHM=hierarchical on several emulated nodes of equal size?"""
    from hpcring.torch import basics

    return (
        os.environ.get("HPCRING_ALLREDUCE_ALGORITHM") == "hierarchical"
        and basics.cross_size() > 1
        and basics.is_homogeneous()
    )


def expected_stages() -> tuple[str, ...]:
    """The hierarchical stages an allreduce of this launch reports: all three, except on the process-group
    route with one rank per node, where the cross-node stage is all there is."""
    from hpcring.torch import basics

    if ROUTE.endswith("+mpi") or basics.local_size() > 1:
        return STAGES
    return ("CROSS_ALLREDUCE",)


def values(q: int, n: int) -> torch.Tensor:
    """Rank q's contribution in the allreduce tests: small integers (1..3), exact in every dtype."""
    return (torch.arange(n, dtype=torch.int64) + q) % 3 + 1


def reinit(hvd: Any, **env: str) -> None:
    """shutdown(), set (or with "" unset) environment variables, init() again."""
    hvd.shutdown()
    for k, v in env.items():
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    hvd.init()


# ---------------------------------------------------------------------- timeline checks

STAGES = ("INTRA_REDUCE_SCATTER", "CROSS_ALLREDUCE", "INTRA_ALLGATHER")
TRACKS = {"INTRA_REDUCE_SCATTER": 1, "CROSS_ALLREDUCE": 2, "INTRA_ALLGATHER": 3}


def record(hvd: Any, comm: Any, folder: Path, name: str, work: Any) -> list[dict[str, Any]] | None:
    """Run `work()` with a run-time timeline written to `folder` (the same on every rank: `shared_tmp`);
    rank 0 returns the parsed events (None elsewhere)."""
    r = hvd.rank()
    path = folder / f"{name}.json"
    hvd.start_timeline(str(path))
    work()
    hvd.stop_timeline()
    comm.Barrier()
    if r != 0:
        return None
    events: list[dict[str, Any]] = json.loads(path.read_text())  # valid JSON: the array was closed
    return events


def spans(events: list[dict[str, Any]], tensor: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(phase, tid) -> [(begin, end)] on `tensor`'s row; asserts that B/E nest strictly per track."""
    pid = next(e["pid"] for e in events if e["name"] == "process_name" and e["args"]["name"] == tensor)
    stacks: dict[int, list[tuple[str, float]]] = {}
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e in events:
        if e.get("pid") != pid or e.get("ph") not in ("B", "E"):
            continue
        stack = stacks.setdefault(e["tid"], [])
        if e["ph"] == "B":
            stack.append((e["name"], e["ts"]))
        else:
            name, begin = stack.pop()
            assert name == e["name"], f"{tensor}: {e['name']} closes {name} on track {e['tid']}"
            out.setdefault((name, e["tid"]), []).append((begin, e["ts"]))
    assert all(not s for s in stacks.values()), f"{tensor}: unclosed spans {stacks}"
    return out


def check_stages_nested(
    events: list[dict[str, Any]], tensor: str, expected: tuple[str, ...] | None = None
) -> dict[str, tuple[float, float]]:
    """Every stage this launch reports once on its own track, inside the tensor's COLLECTIVE span; returns the
    stage spans."""
    found = spans(events, tensor)
    (collective,) = found[("COLLECTIVE", 0)]
    stages = {}
    expected = expected_stages() if expected is None else expected
    assert not {k for k, _ in found if k in STAGES} - set(expected), (tensor, found)
    for stage in expected:
        (span,) = found[(stage, TRACKS[stage])]
        assert collective[0] <= span[0] <= span[1] <= collective[1], (tensor, stage, span, collective)
        stages[stage] = span
    # The stages follow one another: each begins no earlier than the previous one began.
    begins = [stages[s][0] for s in expected]
    assert begins == sorted(begins), (tensor, stages)
    return stages
