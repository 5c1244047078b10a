"""`hpcring.spark.run`: Horovod's `horovod.spark.run` (horovod/spark/runner.py) over hpcring.

The driver starts a rendezvous store, checks that the cluster has a free task slot for every process, and
runs one barrier stage of `num_proc` tasks (all start together or none). Each task forms the world with
the others the way Ray's actors do (`hpcring.spark.task`), runs `fn(*args, **kwargs)` and returns its
result; the results come back in rank order. When a task fails, Spark kills the stage's other tasks (their
workers follow, as they watch their task's process) and the error names the failing rank and task with its
traceback, or, for a task lost without a report, its rank, task, host and executor (`hpcring.spark.stage`).
Horovod's parameters that choose its own launchers (Gloo, mpirun arguments, NICs, the output streams, the
executable) have no meaning here: they are refused when set to anything but their default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hpcring.spark import executors, options
from hpcring.spark.stage import SparkStage, StageFailure


def call_with(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The function of the worker's executable (none here) that calls `fn(*args, **kwargs)`."""
    a, kw = list(args), dict(kwargs)

    def call(_executable: Any) -> Any:
        return fn(*a, **kw)

    return call


def spark_context() -> Any:
    """The session's SparkContext (pyspark is imported only here, when a run starts)."""
    from hpcring import _deps

    return _deps.require("pyspark").SparkContext.getOrCreate()


def pickled_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None) -> bytes:
    """`fn(*args, **kwargs)` as the tasks receive it, pickled by value (cloudpickle)."""
    from hpcring import _deps

    return bytes(_deps.require("cloudpickle").dumps(call_with(fn, args, kwargs or {})))


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
    options.refuse_unsupported(
        "run",
        {
            "use_mpi": use_mpi,
            "use_gloo": use_gloo,
            "extra_mpi_args": extra_mpi_args,
            "stdout": stdout,
            "stderr": stderr,
            "nics": nics,
            "executable": executable,
        },
    )
    stamp_env = options.output_env(prefix_output_with_timestamp)
    timeout = options.start_timeout(start_timeout)
    sc = spark_context()
    executors.check(sc, "hpcring.spark.run")
    size = options.num_proc(sc, num_proc)
    payload = pickled_call(fn, args, kwargs)
    stage = SparkStage(sc, "run")
    try:
        job_env = {**{str(k): str(v) for k, v in (env or {}).items()}, **stamp_env}
        job = stage.job(size, "world/1", timeout, job_env)
        return stage.run(job, payload)
    except StageFailure as failure:
        raise failure.error from failure.__cause__
    finally:
        stage.close()
