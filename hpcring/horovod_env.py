"""Every environment variable Horovod reads, and what hpcring does with each.

Horovod users carry tuned environments from job to job. A variable hpcring does not act on must not be
ignored in silence: `init()` reports, once and on rank 0, each such variable that is set, with what hpcring
does instead. The table in docs/guide/torch.md ("HOROVOD_* variables") is this registry in prose; a test keeps
the two in step.

Sources: horovod/common/common.h (the runtime's variables), horovod/common/operations.cc and
utils/env_parser.cc (where they are read), horovod/common/gloo/gloo_context.cc and horovod/runner (the
variables horovodrun exports to its workers), Horovod 0.28.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger("hpcring.horovod_env")


@dataclass(frozen=True)
class HorovodVariable:
    """One Horovod variable: whether hpcring honours it, and how (or what to use instead)."""

    name: str
    honoured: bool
    what: str  # honoured: what it does in hpcring; ignored: why, and what hpcring does instead
    # Honoured for some values only: the values hpcring acts on (lower case); other values are reported.
    honoured_values: tuple[str, ...] = ()

    def ignored(self, value: str) -> bool:
        """Whether this setting, with this value, has no effect in hpcring."""
        if self.honoured_values:
            return value.strip().lower() not in self.honoured_values
        return not self.honoured


def _v(name: str, honoured: bool, what: str, values: Iterable[str] = ()) -> HorovodVariable:
    return HorovodVariable(f"HOROVOD_{name}", honoured, what, tuple(values))


_ENGINE = "read by the engine at init(); HPCRING_{0} wins when both are set"

VARIABLES: tuple[HorovodVariable, ...] = (
    # Engine settings (hpcring/config.py reads HPCRING_<name> first, then HOROVOD_<name>).
    _v(
        "FUSION_THRESHOLD",
        True,
        "bytes packed into one fused collective; " + _ENGINE.format("FUSION_THRESHOLD"),
    ),
    _v("CYCLE_TIME", True, "milliseconds between negotiation cycles; " + _ENGINE.format("CYCLE_TIME")),
    _v("CACHE_CAPACITY", True, "response-cache entries (0 disables); " + _ENGINE.format("CACHE_CAPACITY")),
    _v("TIMELINE", True, "Chrome-trace path, or DYNAMIC for start_timeline(); " + _ENGINE.format("TIMELINE")),
    _v("TIMELINE_MARK_CYCLES", True, "CYCLE_START marks in the timeline"),
    _v("STALL_CHECK_DISABLE", True, "turns the stall inspector off"),
    _v(
        "STALL_CHECK_TIME_SECONDS",
        True,
        "seconds before a stalled tensor is reported, naming the missing ranks",
    ),
    _v("STALL_SHUTDOWN_TIME_SECONDS", True, "seconds of stall before every rank stops with an error"),
    _v(
        "HIERARCHICAL_ALLREDUCE",
        True,
        "node-aware allreduce (same as HPCRING_ALLREDUCE_ALGORITHM=hierarchical)",
    ),
    _v("LOG_LEVEL", True, "trace, debug, info, warning, error or fatal for hpcring's log"),
    _v("LOG_HIDE_TIME", True, "hpcring's log lines carry no time stamp, so there is nothing to hide"),
    _v(
        "AUTOTUNE",
        True,
        "tunes the fusion threshold and cycle time during the first optimizer steps from measured step "
        "times (a coordinate search rather than Horovod's Bayesian optimisation; "
        "docs/guide/torch.md, Autotuning)",
    ),
    _v(
        "AUTOTUNE_LOG",
        True,
        "CSV file of every sample the autotuner scored and its choice, written by rank 0",
    ),
    _v("AUTOTUNE_WARMUP_SAMPLES", True, "samples run before scoring starts (default 3)"),
    _v("AUTOTUNE_STEPS_PER_SAMPLE", True, "optimizer steps per sample (default 10)"),
    _v(
        "AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        True,
        "the most samples scored, warm-up not counted, before the best is kept (default 20)",
    ),
    _v(
        "AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        False,
        "hpcring's autotuner is a coordinate search with a confirming sample, not a Gaussian process; "
        "set HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE higher to average out noise",
    ),
    _v("ELASTIC", True, "DistributedOptimizer reduces even at one rank, as Horovod's does in elastic mode"),
    _v(
        "DYNAMIC_PROCESS_SETS",
        True,
        "add_process_set/remove_process_set always work in hpcring; nothing to turn on",
    ),
    # Operations and transports.
    _v(
        "CPU_OPERATIONS",
        True,
        "CPU tensors are reduced over MPI; other values (gloo, ccl) are not available",
        ("mpi",),
    ),
    _v(
        "CONTROLLER",
        True,
        "negotiation runs over MPI; the gloo controller is not available (elastic jobs re-form their MPI "
        "world instead: docs/guide/elastic.md)",
        ("mpi",),
    ),
    _v(
        "MPI_THREADS_DISABLE",
        False,
        "MPI runs at MPI_THREAD_MULTIPLE, which hpcring's engine thread needs (it calls MPI alongside the "
        "script's thread): a lower level is an error at init",
    ),
    _v(
        "HIERARCHICAL_ALLGATHER",
        False,
        "allgather always runs as one MPI Allgatherv over all ranks; only allreduce has a node-aware path",
    ),
    _v(
        "TORUS_ALLREDUCE",
        False,
        "no torus allreduce; HPCRING_ALLREDUCE_ALGORITHM=hierarchical is the node-aware algorithm "
        "(node-local reduce-scatter, cross-node allreduce, node-local allgather)",
    ),
    _v(
        "DISABLE_GROUP_FUSION",
        False,
        "a group may share a fused batch with other ready tensors; results do not depend on it, and a "
        "group's tensors are always reduced together",
    ),
    _v(
        "ADASUM_MPI_CHUNK_SIZE",
        True,
        "bytes per message of Adasum's point-to-point exchanges (default 1 GiB); read where Adasum runs; "
        "HPCRING_ADASUM_MPI_CHUNK_SIZE wins when both are set",
    ),
    _v(
        "THREAD_AFFINITY",
        False,
        "the engine thread is not pinned; bind whole ranks instead (hpcring render's per-rank CPU sets, "
        "or the launcher's --bind-to)",
    ),
    _v(
        "NUM_NCCL_STREAMS",
        True,
        "communication streams per GPU and process set, each with its own NCCL communicators; batches take "
        "them in turn",
    ),
    _v(
        "GPU_OPERATIONS",
        True,
        "NCCL (process groups) or MPI (CUDA tensors staged through pinned host memory and reduced over MPI) "
        "for every GPU collective",
        ("nccl", "mpi"),
    ),
    *(
        _v(
            f"GPU_{op}",
            True,
            f"NCCL or MPI for GPU {op.lower()}s (over HOROVOD_GPU_OPERATIONS)",
            ("nccl", "mpi"),
        )
        for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
    ),
    _v(
        "BATCH_D2D_MEMCOPIES",
        False,
        "GPU fusion-buffer copies are torch copies on the device plane's stream; there is no batched-copy "
        "kernel",
    ),
    _v(
        "ENABLE_ASYNC_COMPLETION",
        True,
        "synchronize() of a GPU op makes the caller's current stream wait for the communication stream "
        "instead of waiting on the CPU; results are then readable from that stream",
    ),
    _v("DISABLE_NVTX_RANGES", False, "hpcring emits no NVTX ranges, so there is nothing to disable"),
    _v("ENABLE_XLA_OPS", False, "XLA ops are TensorFlow's; hpcring serves PyTorch only"),
    _v("CCL_CACHE", False, "oneCCL is not driven by hpcring (CPU over MPI, GPUs over NCCL)"),
    _v(
        "GLOO_IFACE",
        False,
        "no Gloo transport; choose MPI's interface instead (Open MPI: OMPI_MCA_btl_tcp_if_include, "
        "MPICH/OFI: FI_TCP_IFACE)",
    ),
    # What horovodrun exports to the workers it starts in Gloo mode: hpcring's launcher exports them too.
    *(
        _v(
            name,
            True,
            "exported to every rank by hpcring run, and set by init() when absent (srun, mpirun), with "
            "this rank's place (docs/guide/launcher.md, the rank environment); hpcring itself reads ranks "
            "from MPI",
        )
        for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
    ),
    *(
        _v(
            name,
            False,
            "Gloo rendezvous of horovodrun; hpcring's world comes from MPI (mpiexec, srun, jsrun)",
        )
        for name in ("GLOO_RENDEZVOUS_ADDR", "GLOO_RENDEZVOUS_PORT", "SECRET_KEY")
    ),
    _v(
        "GLOO_TIMEOUT_SECONDS",
        False,
        "Gloo's connect and operation timeout in horovodrun's Gloo mode (30 s); hpcring's world comes from "
        "MPI, and a collective that hangs is bounded by HPCRING_COLLECTIVE_TIMEOUT (hpcring run "
        "--collective-timeout, 300 s)",
    ),
)

BY_NAME: dict[str, HorovodVariable] = {v.name: v for v in VARIABLES}


def ignored_settings(env: Mapping[str, str]) -> list[str]:
    """One line per Horovod variable set in `env` that hpcring does not act on (with that value)."""
    return [
        f"{v.name}={env[v.name]} is ignored: {v.what}"
        for v in VARIABLES
        if v.name in env and v.ignored(env[v.name])
    ]


_reported = False


def report_ignored(
    rank: int, env: Mapping[str, str] | None = None, emit: Callable[[str], None] | None = None
) -> int:
    """Report the ignored Horovod settings once per process, on rank 0; returns how many were reported."""
    global _reported
    if _reported or rank != 0:
        return 0
    _reported = True
    lines = ignored_settings(os.environ if env is None else env)
    if lines:
        (emit or log.warning)(
            "Horovod settings that hpcring does not act on (docs/guide/torch.md, HOROVOD_* variables):\n  "
            + "\n  ".join(lines)
        )
    return len(lines)
