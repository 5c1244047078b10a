"""What each Spark task of `hpcring.spark.run` does: it plays the part a Ray actor plays for `hpcring.ray`.

The task takes its rank from the barrier stage (tasks grouped by host, so the ranks of one host are
consecutive and local ranks come out as `mpiexec` numbers them), then drives one `hpcring.ray.actor`
`WorkerActor` in-process: that starts the `mpiexec -n 1` worker, which forms the world with the other
tasks' workers through the driver's rendezvous store (docs/dev/ray.md), and runs the function there.

The task tells the driver's store where it runs (`joined/<rank>`) before it starts its worker, so the driver
can name a rank whose task is lost without a word (its Python worker or its executor killed). A task that
fails records its rank, traceback and the kind of failure (`failed/<rank>`) before it raises. Once its
worker joined, it records the MPICH shared-memory files the worker mapped (`shm/<rank>`): a worker killed
with a lost world leaves them in /dev/shm, and the driver (its own host) or the next world's tasks (theirs)
remove them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from hpcring.errors import LaunchError

FAILED_KEY = "failed/"
JOINED_KEY = "joined/"
SHM_KEY = "shm/"  # the MPICH shared-memory files a rank's worker mapped, for clean-up after a lost world
_SHM_PREFIX = "/dev/shm/mpich_shm_"
STOP_GRACE_S = 6.0  # the worker's MPI_Finalize gets 5 s (hpcring.ray.worker), then it is killed
# The kinds of failure a task reports: the function raised (its worker lives on), or the worker process
# ended or could not join (a lost peer, an elastic reset exit, a crash).
RAISED, ENDED = "raised", "ended"
_EXECUTOR_CLASS = b"CoarseGrainedExecutorBackend"


class SparkJobFailed(LaunchError):
    """A rank of `hpcring.spark.run` failed or was lost; the message names it (and carries its traceback
    when it could report one)."""

    def __init__(self, message: str, rank: int | None = None, task: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.task = task


def ranks_by_host(hosts: list[str]) -> list[int]:
    """The rank of each task (index = task's partition): hosts in order of first appearance, tasks of one
    host consecutive in partition order."""
    order = {host: i for i, host in enumerate(dict.fromkeys(hosts))}
    ranked = sorted(range(len(hosts)), key=lambda p: (order[hosts[p]], p))
    ranks = [0] * len(hosts)
    for rank, partition in enumerate(ranked):
        ranks[partition] = rank
    return ranks


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def executor_id(pid: int | None = None) -> str | None:
    """The Spark executor id of the executor JVM this process descends from (its `--executor-id` argument),
    or None where /proc cannot tell (not Linux, or not under a standalone/YARN executor backend)."""
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(OSError, ValueError, IndexError):
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                args = cmd.read().split(b"\0")
            if any(_EXECUTOR_CLASS in a for a in args) and b"--executor-id" in args:
                return args[args.index(b"--executor-id") + 1].decode()
            pid = _parent(pid)
    return None


def remove_worker_files(paths: list[str]) -> None:
    """Remove the MPICH shared-memory files of workers that were killed (they cannot remove their own:
    only MPI_Finalize does); any other path is left alone."""
    for path in paths:
        if path.startswith(_SHM_PREFIX) and "/" not in path[len(_SHM_PREFIX) :]:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _publish(spec: dict[str, Any], key: str, record: dict[str, Any]) -> None:
    """Set `key` to `record` (with this host and the time) in the driver's store; nothing if unreachable."""
    from hpcring.launch.rendezvous_store import StoreClient

    try:
        client = StoreClient(spec["store"], spec["token"], connect_timeout=5.0)
    except LaunchError:
        return
    try:
        client.set(key, json.dumps({**record, "host": socket.gethostname(), "time": time.time()}))
    finally:
        client.close()


def run_task(job: dict[str, Any], payload: bytes, _rows: Iterable[Any]) -> Iterator[bytes]:
    """The barrier task's body: form the world, run the function, yield the pickled (rank, result).

    The variables set for the worker are undone afterwards: Spark reuses the task's Python process."""
    saved = dict(os.environ)
    try:
        yield _run(job, payload)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run(job: dict[str, Any], payload: bytes) -> bytes:
    from pyspark import BarrierTaskContext

    from hpcring import _deps
    from hpcring.ray.actor import WorkerActor, WorkerFailed

    cloudpickle = _deps.require("cloudpickle")

    context = BarrierTaskContext.get()
    task = context.partitionId()
    rank = ranks_by_host(context.allGather(socket.gethostname()))[task]
    spec = {**job, "rank": rank, "executable": (None, (), {})}
    where = {"rank": rank, "task": task, "executor": executor_id(), "pid": os.getpid()}
    _publish(spec, f"{JOINED_KEY}{rank}", where)
    remove_worker_files(job.get("stale_files", {}).get(socket.gethostname(), []))  # a lost world's
    actor = WorkerActor()
    try:
        actor.start_worker(spec, float(job["timeout"]))
        _publish(spec, f"{SHM_KEY}{rank}", {"paths": actor.ready().get("shm", [])})
        result = actor.execute(cloudpickle.loads(payload))
    except BaseException as exc:
        notes = "".join(f"\n{n}" for n in getattr(exc, "__notes__", []))
        text = "".join(traceback.format_exception_only(exc)) + notes
        kind = ENDED if isinstance(exc, WorkerFailed) else RAISED
        _publish(spec, f"{FAILED_KEY}{rank}", {**where, "kind": kind, "traceback": text})
        actor.stop_worker(0.0)
        raise
    context.barrier()  # every rank is done: the workers may finalise together
    actor.stop_worker(STOP_GRACE_S)
    if job.get("remove_after"):  # the elastic commit store of this host: the run is complete
        shutil.rmtree(job["remove_after"], ignore_errors=True)
    return bytes(cloudpickle.dumps((rank, result)))
