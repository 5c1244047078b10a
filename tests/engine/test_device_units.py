"""Single-process checks of the device data plane's pieces: its settings, its torch arithmetic against the
host path's numpy arithmetic, the route table, and the timeline's stage hook (tracks; no-op when off)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcring.collective import dtypes
from hpcring.collective.arrays import numpy_view
from hpcring.collective.stages import CROSS_ALLREDUCE, INTRA_REDUCE_SCATTER, unobserved
from hpcring.config import engine_settings
from hpcring.engine.timeline import Timeline, stage_hook
from hpcring.errors import CollectiveError, ConfigError

torch = pytest.importorskip("torch")
device = pytest.importorskip("hpcring.engine.device_routes")


def test_settings() -> None:
    s = engine_settings({})
    assert (s.cpu_device_plane, s.device_cross) == ("off", "mpi")
    s = engine_settings({"HPCRING_CPU_DEVICE_PLANE": "GLOO", "HPCRING_DEVICE_CROSS": "nccl"})
    assert (s.cpu_device_plane, s.device_cross) == ("gloo", "nccl")
    with pytest.raises(ConfigError, match=r"HPCRING_DEVICE_CROSS='ucx' is not allowed; use 'mpi' or 'nccl'"):
        engine_settings({"HPCRING_DEVICE_CROSS": "ucx"})
    with pytest.raises(ConfigError, match="HPCRING_CPU_DEVICE_PLANE='1'"):
        engine_settings({"HPCRING_CPU_DEVICE_PLANE": "1"})
    assert engine_settings({"HPCRING_CPU_DEVICE_PLANE": "mpi"}).cpu_device_plane == "mpi"


def test_gpu_carriers_follow_horovods_variables() -> None:
    """HOROVOD_GPU_OPERATIONS sets every op's carrier, HOROVOD_GPU_<OP> overrides one, the HPCRING_ twin
    wins over the HOROVOD_ name; anything but NCCL or MPI is refused naming the variable."""
    s = engine_settings({})
    assert [s.gpu_carrier(op) for op in ("allreduce", "allgather", "reducescatter")] == ["nccl"] * 3
    s = engine_settings({"HOROVOD_GPU_OPERATIONS": "MPI", "HOROVOD_GPU_ALLGATHER": "NCCL"})
    assert (s.gpu_carrier("allreduce"), s.gpu_carrier("allgather"), s.gpu_carrier("alltoall")) == (
        "mpi",
        "nccl",
        "mpi",
    )
    s = engine_settings({"HOROVOD_GPU_ALLREDUCE": "NCCL", "HPCRING_GPU_ALLREDUCE": "mpi"})
    assert s.gpu_carrier("allreduce") == "mpi" and s.gpu_carrier("broadcast") == "nccl"
    with pytest.raises(ConfigError, match=r"HOROVOD_GPU_ALLREDUCE='DDL' is not allowed; use 'nccl' or 'mpi'"):
        engine_settings({"HOROVOD_GPU_ALLREDUCE": "DDL"})


def test_streams_and_async_completion() -> None:
    s = engine_settings({"HOROVOD_NUM_NCCL_STREAMS": "2", "HOROVOD_ENABLE_ASYNC_COMPLETION": "1"})
    assert (s.num_streams, s.async_completion) == (2, True)
    assert (engine_settings({}).num_streams, engine_settings({}).async_completion) == (1, False)
    with pytest.raises(ConfigError, match="HOROVOD_NUM_NCCL_STREAMS"):
        engine_settings({"HOROVOD_NUM_NCCL_STREAMS": "0"})


def test_routes() -> None:
    assert device.route_of("cuda") == ("cuda", "nccl")
    assert device.route_of("cuda+mpi") == ("cuda", "mpi")
    assert device.route_of("cpu+gloo") == ("cpu", "gloo")
    assert device.route_of("cpu+mpi") == ("cpu", "mpi")
    known = r"cpu\+gloo, cpu\+mpi, cuda, cuda\+mpi"
    with pytest.raises(
        CollectiveError, match=rf"no device data plane for device 'mps'; known routes: {known}"
    ):
        device.route_of("mps")


@pytest.mark.parametrize(
    "name", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8"]
)
@pytest.mark.parametrize("factor", [0.5, 1 / 3, 2.5, 1 / 7])
def test_scaling_matches_the_host_path(name: str, factor: float) -> None:
    """The device plane scales torch tensors exactly as `dtypes.scale` scales numpy arrays."""
    raw = np.arange(-40, 60, dtype=np.float64) * 1.37
    if name in dtypes.INTEGERS:
        raw = np.abs(raw) if name == "uint8" else raw
        raw = np.clip(raw, -100, 100)
    t = torch.tensor(raw).to(getattr(torch, name))
    host = numpy_view(t.clone()).copy()
    dtypes.scale(host, factor)
    device.scale_(t, factor)
    assert np.array_equal(numpy_view(t).astype(np.float64), host.astype(np.float64)), (name, factor)


@pytest.mark.parametrize("name", ["float32", "float16", "int32", "int64"])
def test_average_matches_the_host_path(name: str) -> None:
    t = torch.arange(-20, 21).to(getattr(torch, name))
    host = numpy_view(t.clone()).copy()
    dtypes.average(host, 3)
    device.average_(t, 3)
    assert np.array_equal(numpy_view(t), host)


def test_neutral_values() -> None:
    assert device.neutral("sum", torch.float32) == 0 and device.neutral("average", torch.int8) == 0
    assert device.neutral("product", torch.int64) == 1
    assert device.neutral("min", torch.float16) == 65504.0 and device.neutral("max", torch.int8) == -128
    assert device.neutral("min", torch.bool) is True and device.neutral("max", torch.bool) is False
    with pytest.raises(CollectiveError, match="not bool"):
        device.scale_(torch.ones(2, dtype=torch.bool), 2.0)


def test_no_timeline_means_the_unobserved_hook() -> None:
    assert stage_hook(None, ["a"]) is unobserved
    unobserved(INTRA_REDUCE_SCATTER, True)  # nothing happens, nothing raised


def test_stages_are_written_on_their_own_tracks(tmp_path: Path) -> None:
    """The timeline's stage hook puts each hierarchical stage on its own tid, so stages that overlap in time
    still nest per track; other stages stay on the main track."""
    path = tmp_path / "t.json"
    tl = Timeline(str(path))
    hook = stage_hook(tl, ["a", "b"])
    try:
        hook(INTRA_REDUCE_SCATTER, True)
        hook(CROSS_ALLREDUCE, True)  # overlaps the reduce-scatter, as when pipelined
        hook(INTRA_REDUCE_SCATTER, False)
        hook("OTHER", True)
        hook("OTHER", False)
        hook(CROSS_ALLREDUCE, False)
    finally:
        tl.close()
    events = [e for e in json.loads(path.read_text()) if e.get("ph") in ("B", "E")]
    tracks = {(e["name"], e["ph"]): e["tid"] for e in events if e["pid"] == 1}
    assert tracks == {
        ("INTRA_REDUCE_SCATTER", "B"): 1,
        ("INTRA_REDUCE_SCATTER", "E"): 1,
        ("CROSS_ALLREDUCE", "B"): 2,
        ("CROSS_ALLREDUCE", "E"): 2,
        ("OTHER", "B"): 0,
        ("OTHER", "E"): 0,
    }
    assert len(events) == 12  # both tensors


def test_device_without_a_data_plane_is_staged_under_its_own_name() -> None:
    """Tensors of a device with no data plane travel the host path as "<type>+host": not a device route, and
    not "cpu" either, so validation refuses them next to CPU tensors on another rank (as Horovod does)."""
    from hpcring.torch import tensors

    tensors._routes.clear()
    tensors._warned.discard("mps")
    with pytest.warns(RuntimeWarning, match="no device data plane for 'mps'"):
        route = tensors._device_route("mps")
    assert route == "mps+host"
    assert route not in device.ROUTES and route != "cpu"
    tensors._routes.clear()
