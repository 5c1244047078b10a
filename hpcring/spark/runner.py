"""`hpcring.spark.run`: Horovod's `horovod.spark.run` (horovod/spark/runner.py) over hpcring.

The driver starts a rendezvous store, checks that the cluster has a free task slot for every process, and
runs one barrier stage of `num_proc` tasks (all start together or none). Each task forms the world with
the others the way Ray's actors do (`hpcring.spark.task`), runs `fn(*args, **kwargs)` and returns its
result; the results come back in rank order. When a task fails, Spark kills the stage's other tasks (their
workers follow, as they watch their task's process) and the error names the failing rank and task with its
traceback. Horovod's parameters that choose its own launchers (Gloo, mpirun arguments, NICs, the output
streams, the executable) have no meaning here: they are refused when set to anything but their default.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from hpcring.errors import ConfigError, LaunchError
from hpcring.spark.task import FAILED_KEY, SparkJobFailed, run_task

DEFAULT_START_TIMEOUT_S = 600
REGISTER_WAIT_S = 10.0  # how long a short slot count is read again (executors still registering)


_UNSUPPORTED = {
    "use_mpi": "hpcring always runs over MPI: leave use_mpi unset or True",
    "use_gloo": "hpcring has no Gloo controller: leave use_gloo unset or False",
    "extra_mpi_args": "no mpirun is started (each task's worker is its own mpiexec -n 1)",
    "stdout": "the ranks' output goes to the Spark executors' logs",
    "stderr": "the ranks' output goes to the Spark executors' logs",
    "nics": "MPICH picks the network itself (docs/guide/spark.md)",
    "prefix_output_with_timestamp": "the ranks' output goes to the Spark executors' logs",
    "executable": "the workers run the executors' own Python (PYSPARK_PYTHON)",
}


def _refuse_unsupported(given: dict[str, Any]) -> None:
    """ConfigError for a Horovod parameter set to something hpcring cannot honour (`given`: the
    parameters whose value differs from what hpcring does)."""
    for name, value in given.items():
        raise ConfigError(f"hpcring.spark.run({name}={value!r}) is not supported: {_UNSUPPORTED[name]}")


def _start_timeout(start_timeout: float | None) -> float:
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT_S))
    if start_timeout <= 0:
        raise ConfigError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
    return float(start_timeout)


def _num_proc(spark_context: Any, num_proc: int | None) -> int:
    """`num_proc` (default: the cluster's task slots), refused when the cluster cannot run that many tasks
    at once: a barrier stage would otherwise wait for slots that never come. Executors register after the
    session starts, so a count that is still short is read again for up to REGISTER_WAIT_S seconds."""
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ConfigError(f"num_proc must be a positive integer, got {num_proc!r}")
    deadline = time.monotonic() + REGISTER_WAIT_S
    slots = int(spark_context.defaultParallelism)
    while num_proc is not None and num_proc > slots and time.monotonic() < deadline:
        time.sleep(0.5)
        slots = int(spark_context.defaultParallelism)
    if num_proc is None:
        return slots
    if num_proc > slots:
        raise ConfigError(
            f"num_proc={num_proc} is more than the {slots} task slots of this Spark cluster "
            f"(sc.defaultParallelism, read for {REGISTER_WAIT_S:g} s): a barrier stage needs one free slot "
            "per process"
        )
    return num_proc


def call_with(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The function of the worker's executable (none here) that calls `fn(*args, **kwargs)`."""
    a, kw = list(args), dict(kwargs)

    def call(_executable: Any) -> Any:
        return fn(*a, **kw)

    return call


def _failure(store: Any, num_proc: int, cause: BaseException) -> SparkJobFailed:
    """The error for a failed stage: the earliest rank that reported a failure, else Spark's own reason."""
    records = [json.loads(v) for r in range(num_proc) if (v := store.wait(f"{FAILED_KEY}{r}", 0)) is not None]
    if not records:
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        return SparkJobFailed(
            f"hpcring.spark.run: the Spark job failed before any rank reported: {first_line}"
        )
    first = min(records, key=lambda rec: rec["time"])
    return SparkJobFailed(
        f"hpcring.spark.run: rank {first['rank']} (Spark task {first['task']} on {first['host']}) failed; "
        f"the stage's other tasks were ended:\n{first['traceback']}",
        rank=int(first["rank"]),
        task=int(first["task"]),
    )


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `num_proc` Spark tasks forming one hpcring world; results in rank order.

    `env` is set in each task's worker (default: none beyond the executors' own environment; Horovod copies
    the driver's). `fn` calls `hvd.init()` as under `horovodrun` and finds hpcring initialised.
    """
    del verbose
    chosen = {
        "use_mpi": use_mpi,
        "use_gloo": use_gloo,
        "extra_mpi_args": extra_mpi_args,
        "stdout": stdout,
        "stderr": stderr,
        "nics": nics,
        "prefix_output_with_timestamp": prefix_output_with_timestamp,
        "executable": executable,
    }
    fine = {"use_mpi": (None, True), "use_gloo": (None, False), "prefix_output_with_timestamp": (False,)}
    _refuse_unsupported({k: v for k, v in chosen.items() if v not in fine.get(k, (None,))})
    timeout = _start_timeout(start_timeout)
    from hpcring import _deps

    cloudpickle = _deps.require("cloudpickle")
    pyspark = _deps.require("pyspark")
    from hpcring.launch.rendezvous_store import StoreServer

    sc = pyspark.SparkContext.getOrCreate()
    size = _num_proc(sc, num_proc)
    payload = cloudpickle.dumps(call_with(fn, args, kwargs or {}))
    store = StoreServer()
    job = {
        "size": size,
        "store": f"{sc.getConf().get('spark.driver.host', '127.0.0.1')}:{store.port}",
        "token": store.token,
        "key": "world/1",
        "timeout": timeout,
        "env": {str(k): str(v) for k, v in (env or {}).items()},
    }
    try:
        rdd = sc.parallelize(range(size), size).barrier()
        try:
            pickled = rdd.mapPartitions(lambda rows: run_task(job, payload, rows)).collect()
        except Exception as exc:
            raise _failure(store, size, exc) from exc
    finally:
        store.close()
    results = sorted((cloudpickle.loads(p) for p in pickled), key=lambda pair: pair[0])
    if [r for r, _ in results] != list(range(size)):
        raise LaunchError(f"hpcring.spark.run: expected one result per rank 0..{size - 1}, got {results!r}")
    return [value for _, value in results]
