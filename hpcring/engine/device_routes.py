"""The device routes: how torch tensors that live on a device (or CPU tensors standing in for them in tests)
travel, and the torch arithmetic the device plane shares with the host path.

A route is the agreed `device` field of a request's signature, so validation refuses one rank's CUDA tensor
beside another rank's CPU tensor, or two ranks that chose different routes:

- `cuda`: CUDA tensors over NCCL (inside a node, and flat across nodes unless the hierarchical route crosses
  them over MPI);
- `cuda+mpi`: CUDA tensors staged through pinned host memory and reduced over MPI, on the communication
  stream (Horovod's `HOROVOD_GPU_OPERATIONS=MPI`): clusters without NCCL, and several ranks on one GPU;
- `cpu+gloo` and `cpu+mpi`: CPU tensors through the same two routes, gloo standing in for NCCL
  (`HPCRING_CPU_DEVICE_PLANE`): how CI runs every line of the device plane that is not CUDA-specific.

Tensors of other device types (and every device tensor when the caller asks for no device plane) are staged
by the caller and take the host path under `<type>+host`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from hpcring import _deps
from hpcring.errors import CollectiveError

if TYPE_CHECKING:
    from hpcring.collective.topology import Topology
    from hpcring.engine.responses import Response


class Route(NamedTuple):
    """Where a route's tensors live and what carries them: "nccl" or "gloo" (a torch.distributed process
    group), or "mpi" (staged through host memory, reduced by the collective floor over MPI)."""

    device_type: str
    carrier: str


CUDA = "cuda"
CUDA_MPI = "cuda+mpi"
CPU_GLOO = "cpu+gloo"
CPU_MPI = "cpu+mpi"
ROUTES: dict[str, Route] = {
    CUDA: Route("cuda", "nccl"),
    CUDA_MPI: Route("cuda", "mpi"),
    CPU_GLOO: Route("cpu", "gloo"),
    CPU_MPI: Route("cpu", "mpi"),
}
STAND_INS = {"gloo": CPU_GLOO, "mpi": CPU_MPI}  # HPCRING_CPU_DEVICE_PLANE -> the route of CPU tensors
# Suffix of the device name of tensors the caller stages through host memory ("xpu+host"): the host path
# reduces them, and validation still tells them apart from CPU tensors on another rank.
HOST_STAGED = "+host"
# dtypes a process-group route cannot carry: NCCL has no 16-bit integer type, and gloo, its CPU stand-in,
# refuses int16 too. Such tensors take the MPI route of their device instead of failing.
NO_GROUP_DTYPES = frozenset({"int16"})
MPI_ROUTE_OF = {CUDA: CUDA_MPI, CPU_GLOO: CPU_MPI}


_last_device: dict[str, Any] = {}  # device type -> the torch.device this process last submitted a tensor on


def note_device(device: Any) -> None:
    """Remember the device this rank's tensors live on (called at submit), so a rank that joined, or whose
    first device batch holds no tensor of its own, contributes on the right device."""
    _last_device[device.type] = device


def route_of(device: str) -> Route:
    """The route of an agreed signature device; CollectiveError naming the known routes."""
    found = ROUTES.get(device)
    if found is None:
        raise CollectiveError(
            f"no device data plane for device {device!r}; known routes: {', '.join(sorted(ROUTES))}"
        )
    return found


def rank_device(device_type: str, topo: Topology) -> Any:
    """This rank's torch.device of `device_type`: the last one it submitted a tensor on; else (a rank with
    no tensor of its own yet) the conventional one: cuda:LOCAL_RANK (by world rank under emulated nodes)."""
    torch = _deps.torch()
    seen = _last_device.get(device_type)
    if seen is not None:
        return seen
    if device_type == "cuda":
        emulated = os.environ.get("HPCRING_EMULATE_NODES")
        index = int(os.environ.get("RANK" if emulated else "LOCAL_RANK", topo.local_rank))
        return torch.device("cuda", index % max(1, torch.cuda.device_count()))
    return torch.device(device_type)


def tensors(r: Response) -> tuple[Any, Any]:
    """(input, result tensor) of this rank's request in a response, (None, None) for a joined rank. The
    result tensor is the preallocated output, or the input itself for in-place ops and ops without one."""
    req = r.local
    if req is None:
        return None, None
    t: Any = req.tensor
    out: Any = req.output
    return t, (t if out is None else out)


# ------------------------------------------------------------ torch arithmetic (host-path semantics)


def torch_dtype(name: str) -> Any:
    """torch dtype of an agreed dtype name (the names are torch's too: float32, bfloat16, bool, ...)."""
    return getattr(_deps.torch(), name)


def neutral(op: str, dtype: Any) -> Any:
    """What a joined rank contributes: 0 for Sum/Average (Horovod), the identity for Min/Max/Product."""
    torch = _deps.torch()
    if op == "product":
        return 1
    if op not in ("min", "max"):
        return 0
    if dtype == torch.bool:
        return op == "min"
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.max if op == "min" else info.min


def scale_(buf: Any, factor: float) -> None:
    """Multiply in place with one rounding per element: floats (16-bit ones are computed in float32 by
    torch), integers in float64 truncated toward zero, as `dtypes.scale` does on the host path."""
    if factor == 1.0 or buf.numel() == 0:
        return
    if buf.is_floating_point():
        buf.mul_(factor)
    elif buf.dtype == _deps.torch().bool:
        raise CollectiveError("scale factors apply to numeric dtypes only, not bool")
    else:
        buf.copy_(buf.double().mul_(factor).trunc_())


def average_(buf: Any, n: int) -> None:
    """Sum -> Average over `n` ranks: floats scaled by 1/n, integers divided exactly and truncated (as
    `dtypes.average`)."""
    if n == 1 or buf.numel() == 0:
        return
    if buf.is_floating_point():
        buf.mul_(1.0 / n)
    else:
        buf.copy_(buf.double().div_(n).trunc_())
