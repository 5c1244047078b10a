"""Horovod's rules for op=Adasum, checked where an allreduce is submitted (horovod/torch/mpi_ops.py).

Every rule depends only on what all ranks agree on (the job's layout, the process set, the route), so a
refused call raises on every rank before anything is queued, never a hang:

- the global process set only;
- float16, float32 or float64 tensors;
- host tensors and the MPI route (`HOROVOD_GPU_OPERATIONS=MPI`): Adasum over every rank, whose number must be
  a power of two;
- CUDA tensors over NCCL (and `cpu+gloo`, CI's stand-in): Horovod's hierarchical Adasum, a sum inside each
  node, Adasum across the nodes, divided by the node's rank count. Nodes must hold the same number of ranks,
  and their number must be a power of two.
"""

from __future__ import annotations

from typing import Any

from hpcring.collective import kernels
from hpcring.engine import ProcessSet, device_routes
from hpcring.errors import ConfigError
from hpcring.torch import basics
from hpcring.torch.tensors import _view


class AdasumUnsupported(ConfigError, NotImplementedError):
    """An Adasum call Horovod refuses: a ConfigError (ValueError) like hpcring's other refusals, and the
    NotImplementedError Horovod raises, so either `except` catches it."""


def node_aware(route: str) -> bool:
    """Does `route` reduce Adasum inside each node first (the process-group routes: NCCL, gloo in CI)?"""
    found = device_routes.ROUTES.get(route)
    return found is not None and found.carrier != "mpi"


def check(dtype: str, route: str, process_set: ProcessSet | None, what: str) -> None:
    """Refuse an op=Adasum allreduce that Horovod refuses, naming the rule and what is allowed."""
    if basics._set_id(process_set) != 0:
        raise AdasumUnsupported(
            f"{what}: op=Adasum runs on the global process set only (as Horovod); allowed: "
            "process_set=hvd.global_process_set"
        )
    if dtype not in kernels.ADASUM_DTYPES:
        allowed = ", ".join(repr(d) for d in kernels.ADASUM_DTYPES)
        raise AdasumUnsupported(f"{what}: op=Adasum does not reduce {dtype!r} tensors; allowed: {allowed}")
    check_ranks(route, what)


def check_ranks(route: str, what: str) -> None:
    """Horovod's rank rule for `route`: a power-of-two world, or (node-aware routes) equal nodes, a
    power-of-two number of them."""
    size = basics.size()
    if node_aware(route):
        if not basics.is_homogeneous():
            raise AdasumUnsupported(
                f"{what}: op=Adasum on {route!r} tensors needs every node to run the same number of ranks "
                f"(Horovod's hierarchical Adasum); this job's nodes differ; allowed: equal nodes, or the MPI "
                "route (HOROVOD_GPU_OPERATIONS=MPI) with a power-of-two number of ranks"
            )
        nodes = size // basics.local_size()
        if not kernels.is_power_of_two(nodes):
            raise AdasumUnsupported(
                f"{what}: op=Adasum on {route!r} tensors needs a power-of-two number of nodes (Horovod's "
                f"hierarchical Adasum), this job has {nodes}; allowed: {kernels.adasum_sizes(nodes)} nodes"
            )
        return
    if not kernels.is_power_of_two(size):
        raise AdasumUnsupported(
            f"{what}: op=Adasum needs a power-of-two number of ranks (as Horovod), this job has {size}; "
            f"allowed: {kernels.adasum_sizes(size)} ranks"
        )


def route_of(tensor: Any) -> str:
    """The route a tensor's allreduce would take (what `tensors._view` decides), for checks made before any
    tensor is submitted (the Adasum optimizer's construction)."""
    return _view(tensor).device
