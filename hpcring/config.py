"""Runtime settings of the engine, read from the environment in one place.

Every setting has an `HPCRING_*` variable (what `hpcring run` exports from its flags) and, for users migrating
from Horovod, the matching `HOROVOD_*` name as an alias; when both are set the `HPCRING_*` one wins. A bad
value is a ConfigError naming the variable, the value and what is allowed, raised at `init()` rather than deep
in a background thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpcring.errors import ConfigError, choices

ALGORITHMS = ("auto", "native", "ring", "hierarchical", "shm")  # allreduce algorithms (collective.selection)
CPU_DEVICE_PLANES = ("off", "gloo", "mpi")  # HPCRING_CPU_DEVICE_PLANE: CPU tensors standing in for GPU ones
GPU_CARRIERS = ("nccl", "mpi")  # HPCRING_GPU_OPERATIONS / HOROVOD_GPU_<OP>: what moves CUDA tensors
GPU_OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
DEVICE_CROSS = ("mpi", "nccl")  # HPCRING_DEVICE_CROSS: what carries the device plane's cross-node stage
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024  # bytes, as Horovod
DEFAULT_CYCLE_TIME_MS = 1.0
DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedOptimizer's gradient buckets: DDP's bucket_cap_mb default
DEFAULT_CACHE_CAPACITY = 1024
DEFAULT_STALL_CHECK_S = 60.0
# The most ranks a job may have (`hpcring run -np`, `map --ranks`, nodes x ranks per node): checked before
# anything is sized by it; far beyond the largest machines (a few million cores).
MAX_RANKS = 1 << 24
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0  # HPCRING_COLLECTIVE_TIMEOUT (engine/watchdog.py); 0 turns it off
COLLECTIVE_TIMEOUT_VAR = "HPCRING_COLLECTIVE_TIMEOUT"

_SIZE_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
}
_SIZE_SUFFIX.update({"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30})
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class EngineSettings:
    """What the background engine needs; frozen so a running engine never sees a half-changed value."""

    fusion_threshold: int = (
        DEFAULT_FUSION_THRESHOLD  # bytes packed into one fused collective; 0 disables fusion
    )
    cycle_time_ms: float = DEFAULT_CYCLE_TIME_MS  # minimum time between two negotiation cycles
    cache_capacity: int = DEFAULT_CACHE_CAPACITY  # response-cache entries; 0 disables the fast path
    timeline: str | None = None  # Chrome-trace output path (rank 0, or every rank when it contains "{rank}")
    timeline_mark_cycles: bool = False
    stall_check_time_s: float = DEFAULT_STALL_CHECK_S
    stall_shutdown_time_s: float = 0.0  # 0: never shut down on a stall
    stall_check_disable: bool = False
    # Seconds a started exchange (or negotiation round) may block before the watchdog ends the rank; 0: off.
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    allreduce_algorithm: str = "auto"
    log_level: str = "warning"
    # The device data plane (hpcring/engine/device_plane.py, docs/dev/engine.md "GPU tensors"):
    cpu_device_plane: str = "off"  # "gloo"/"mpi": CPU torch tensors take the device plane's routes (CI)
    device_cross: str = "mpi"  # hierarchical cross-node stage: MPI on a host copy, or the device backend
    num_streams: int = 1  # communication streams (lanes) per device and process set
    async_completion: bool = False  # synchronize() makes the caller's stream wait instead of the CPU
    # Per op of GPU_OPS, what carries CUDA tensors: "nccl" (process groups) or "mpi" (staged on the host).
    gpu_carriers: tuple[str, ...] = ("nccl",) * len(GPU_OPS)

    def gpu_carrier(self, op: str) -> str:
        """What carries CUDA tensors of collective `op` (one of GPU_OPS): "nccl" or "mpi"."""
        return self.gpu_carriers[GPU_OPS.index(op)]

    # DistributedOptimizer (hpcring/torch/buckets.py): MiB of gradients per bucket; 0: one request per tensor
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB


def lookup(env: Mapping[str, str], name: str, aliases: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(variable, value) of the first of HPCRING_<name>, HOROVOD_<name>, *aliases that is set."""
    for var in (f"HPCRING_{name}", f"HOROVOD_{name}", *aliases):
        if var in env:
            return var, env[var].strip()
    return None


def parse_bytes(var: str, text: str) -> int:
    """A byte count such as `67108864`, `64MiB` or `64M`; ConfigError otherwise."""
    m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", text)
    if not m or m.group(2).lower() not in _SIZE_SUFFIX:
        raise ConfigError(
            f"{var}={text!r} is not a byte count; use an integer number of bytes (e.g. 67108864) "
            "or a size like '64MiB'"
        )
    return int(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()]


def parse_float(var: str, text: str, *, minimum: float = 0.0) -> float:
    """A number >= minimum; ConfigError naming the variable otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{var}={text!r} is not a number; expected a number >= {minimum:g}") from None
    if not value >= minimum:  # also refuses NaN
        raise ConfigError(f"{var}={text!r} is out of range; expected a number >= {minimum:g}")
    return value


def parse_int(var: str, text: str, *, minimum: int = 0) -> int:
    """An integer >= minimum; ConfigError naming the variable otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{var}={text!r} is not an integer; expected an integer >= {minimum}") from None
    if value < minimum:
        raise ConfigError(f"{var}={text!r} is out of range; expected an integer >= {minimum}")
    return value


def parse_bool(var: str, text: str) -> bool:
    """1/0, true/false, yes/no, on/off (any case)."""
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"{var}={text!r} is not a boolean; use {choices(('1', '0', 'true', 'false'))}")


def parse_choice(var: str, text: str, allowed: tuple[str, ...]) -> str:
    """One of `allowed` (case-insensitive)."""
    low = text.lower()
    if low not in allowed:
        raise ConfigError(f"{var}={text!r} is not allowed; use {choices(allowed)}")
    return low


def parse_timeout(what: str, text: str) -> float:
    """A collective timeout in seconds: a number > 0, or 0 for no timeout; ConfigError naming `what` (the
    variable or flag) and what is allowed otherwise."""
    allowed = "allowed: a number of seconds > 0 (e.g. 300 or 2.5), or 0 to turn the timeout off"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what}={text!r} is not a number; {allowed}") from None
    if not (value >= 0 and value != float("inf")):  # also refuses NaN
        raise ConfigError(f"{what}={text!r} is out of range; {allowed}")
    return value


def _collective_timeout(env: Mapping[str, str]) -> float:
    """HPCRING_COLLECTIVE_TIMEOUT (hpcring's own: Horovod has no such bound); unset or empty: the default."""
    text = env.get(COLLECTIVE_TIMEOUT_VAR, "").strip()
    return parse_timeout(COLLECTIVE_TIMEOUT_VAR, text) if text else DEFAULT_COLLECTIVE_TIMEOUT_S


def _algorithm(env: Mapping[str, str]) -> str:
    found = lookup(env, "ALLREDUCE_ALGORITHM")
    if found:
        return parse_choice(*found, ALGORITHMS)
    # Horovod's switch for the node-aware allreduce.
    hier = lookup(env, "HIERARCHICAL_ALLREDUCE")
    if hier and parse_bool(*hier):
        return "hierarchical"
    return "auto"


def _log_level(env: Mapping[str, str]) -> str:
    found = lookup(env, "LOG_LEVEL")
    return parse_choice(*found, LOG_LEVELS) if found else "warning"


TIMELINE_DYNAMIC = "DYNAMIC"


def engine_settings(env: Mapping[str, str] | None = None) -> EngineSettings:
    """Read every engine setting from `env` (default: os.environ); ConfigError on the first bad value."""
    env = os.environ if env is None else env
    found = lookup(env, "FUSION_THRESHOLD")
    fusion = parse_bytes(*found) if found else DEFAULT_FUSION_THRESHOLD
    found = lookup(env, "CYCLE_TIME")
    cycle = parse_float(*found) if found else DEFAULT_CYCLE_TIME_MS
    found = lookup(env, "CACHE_CAPACITY")
    cache = parse_int(*found) if found else DEFAULT_CACHE_CAPACITY
    found = lookup(env, "TIMELINE")
    # DYNAMIC (Horovod's word): nothing is written until start_timeline(path) is called at run time.
    timeline = found[1] if found and found[1] and found[1] != TIMELINE_DYNAMIC else None
    found = lookup(env, "TIMELINE_MARK_CYCLES")
    mark = parse_bool(*found) if found else False
    found = lookup(env, "STALL_CHECK_TIME_SECONDS")
    stall = parse_float(*found) if found else DEFAULT_STALL_CHECK_S
    found = lookup(env, "STALL_SHUTDOWN_TIME_SECONDS")
    shutdown = parse_float(*found) if found else 0.0
    found = lookup(env, "STALL_CHECK_DISABLE")
    disable = parse_bool(*found) if found else False
    found = lookup(env, "BUCKET_CAP_MB")
    bucket_cap = parse_float(*found) if found else DEFAULT_BUCKET_CAP_MB
    found = lookup(env, "NUM_NCCL_STREAMS")
    streams = parse_int(*found, minimum=1) if found else 1
    found = lookup(env, "ENABLE_ASYNC_COMPLETION")
    async_completion = parse_bool(*found) if found else False
    return EngineSettings(
        fusion_threshold=fusion,
        cycle_time_ms=cycle,
        cache_capacity=cache,
        timeline=timeline,
        timeline_mark_cycles=mark,
        stall_check_time_s=stall,
        stall_shutdown_time_s=shutdown,
        stall_check_disable=disable,
        collective_timeout_s=_collective_timeout(env),
        allreduce_algorithm=_algorithm(env),
        log_level=_log_level(env),
        cpu_device_plane=_own_choice(env, "HPCRING_CPU_DEVICE_PLANE", CPU_DEVICE_PLANES, "off"),
        device_cross=_own_choice(env, "HPCRING_DEVICE_CROSS", DEVICE_CROSS, "mpi"),
        bucket_cap_mb=bucket_cap,
        num_streams=streams,
        async_completion=async_completion,
        gpu_carriers=_gpu_carriers(env),
    )


def _gpu_carriers(env: Mapping[str, str]) -> tuple[str, ...]:
    """Per op of GPU_OPS, "nccl" or "mpi": HOROVOD_GPU_<OP> (or HPCRING_GPU_<OP>) over HOROVOD_GPU_OPERATIONS
    over NCCL, as Horovod reads them."""
    found = lookup(env, "GPU_OPERATIONS")
    default = parse_choice(*found, GPU_CARRIERS) if found and found[1] else "nccl"
    carriers = []
    for op in GPU_OPS:
        found = lookup(env, f"GPU_{op.upper()}")
        carriers.append(parse_choice(*found, GPU_CARRIERS) if found and found[1] else default)
    return tuple(carriers)


def _own_choice(env: Mapping[str, str], var: str, allowed: tuple[str, ...], default: str) -> str:
    """A choice setting of hpcring's own (no Horovod alias); unset or empty means `default`; "0"/"1"-style
    booleans are not guessed."""
    text = env.get(var, "").strip()
    return parse_choice(var, text, allowed) if text else default
