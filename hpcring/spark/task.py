"""What each Spark task of `hpcring.spark.run` does: it plays the part a Ray actor plays for `hpcring.ray`.

The task takes its rank from the barrier stage (tasks grouped by host, so the ranks of one host are
consecutive and local ranks come out as `mpiexec` numbers them), then drives one `hpcring.ray.actor`
`WorkerActor` in-process: that starts the `mpiexec -n 1` worker, which forms the world with the other
tasks' workers through the driver's rendezvous store (docs/dev/ray.md), and runs the function there. A task
that fails records its rank and traceback in the store before it raises, so the driver can name it.
"""

from __future__ import annotations

import json
import socket
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from hpcring.errors import LaunchError

FAILED_KEY = "failed/"
STOP_GRACE_S = 6.0  # the worker's MPI_Finalize gets 5 s (hpcring.ray.worker), then it is killed


class SparkJobFailed(LaunchError):
    """A rank of `hpcring.spark.run` failed; the message names it and carries its traceback."""

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


def _report(spec: dict[str, Any], rank: int, task: int, text: str) -> None:
    from hpcring.launch.rendezvous_store import StoreClient

    try:
        client = StoreClient(spec["store"], spec["token"], connect_timeout=5.0)
    except LaunchError:
        return
    try:
        record = {"rank": rank, "task": task, "host": socket.gethostname(), "time": time.time()}
        client.set(f"{FAILED_KEY}{rank}", json.dumps({**record, "traceback": text}))
    finally:
        client.close()


def run_task(job: dict[str, Any], payload: bytes, _rows: Iterable[Any]) -> Iterator[bytes]:
    """The barrier task's body: form the world, run the function, yield the pickled (rank, result)."""
    from pyspark import BarrierTaskContext

    from hpcring import _deps
    from hpcring.ray.actor import WorkerActor

    cloudpickle = _deps.require("cloudpickle")

    context = BarrierTaskContext.get()
    task = context.partitionId()
    rank = ranks_by_host(context.allGather(socket.gethostname()))[task]
    spec = {**job, "rank": rank, "executable": (None, (), {})}
    actor = WorkerActor()
    try:
        actor.start_worker(spec, float(job["timeout"]))
        actor.ready()
        result = actor.execute(cloudpickle.loads(payload))
    except BaseException as exc:
        notes = "".join(f"\n{n}" for n in getattr(exc, "__notes__", []))
        _report(spec, rank, task, "".join(traceback.format_exception_only(exc)) + notes)
        actor.stop_worker(0.0)
        raise
    context.barrier()  # every rank is done: the workers may finalise together
    actor.stop_worker(STOP_GRACE_S)
    yield cloudpickle.dumps((rank, result))
