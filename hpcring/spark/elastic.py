"""`hpcring.spark.run_elastic`: Horovod's `horovod.spark.run_elastic` on hpcring's restart-based elastic
training (`hpcring.torch.elastic`, docs/guide/elastic.md), as `hpcring.ray.ElasticRayExecutor` does it.

MPI cannot shrink a running world, so each world is one barrier stage. When a world loses a task (no report:
its Python worker or executor killed) or a worker process ends (the elastic reset exit after a failed
collective, a crash), Spark aborts the stage and the driver forms a new one from the slots the cluster has
then: between `min_np` and `max_np` tasks, waiting up to `elastic_timeout` for `min_np`. Every world gets
the elastic variables (HPCRING_ELASTIC, the commit store's directory, the generation), so
`@hvd.elastic.run` in each fresh worker restores the newest commit and calls the reset callbacks. An
exception the function raises is the caller's error, as in `run`; `reset_limit` bounds the re-formations.

The commit store is a directory of the same path on every host (`/dev/shm/hpcring-spark-<id>`), shared by
the tasks of a host; each rank of a new world reads the newest commit of its host and the ranks agree on the
newest (`hpcring.torch.elastic.runner`), so ranks and hosts may change between worlds. The completing
world's tasks remove it on their hosts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from hpcring.contracts import elastic as contract
from hpcring.errors import ConfigError
from hpcring.spark import executors, options
from hpcring.spark.runner import pickled_call, spark_context
from hpcring.spark.stage import SparkStage, StageFailure
from hpcring.spark.task import RAISED, SparkJobFailed


def np_bounds(num_proc: int, min_np: int | None, max_np: int | None) -> tuple[int, int]:
    """(min_np, max_np) with Horovod's defaults (both `num_proc`), refused naming the field when they
    cannot hold `num_proc` processes."""
    low = options.positive_int("min_np", min_np) or num_proc
    high = options.positive_int("max_np", max_np) or num_proc
    if low > num_proc:
        raise ConfigError(f"min_np={low} is more than num_proc={num_proc}: min_np must be <= num_proc")
    if high < num_proc:
        raise ConfigError(f"max_np={high} is less than num_proc={num_proc}: max_np must be >= num_proc")
    return low, high


def _first_size(
    sc: Any, num_proc: int | None, min_np: int | None, max_np: int | None
) -> tuple[int, int, int]:
    """(first world's size, min_np, max_np): `num_proc` (default: the slots), fewer when the cluster has
    fewer slots (counted for up to REGISTER_WAIT_S), but never fewer than min_np."""
    options.positive_int("num_proc", num_proc)
    wanted = num_proc if num_proc is not None else options.slots(sc)
    low, high = np_bounds(wanted, min_np, max_np)
    size = min(wanted, options.wait_for_slots(sc, wanted, options.REGISTER_WAIT_S))
    if size < low:
        raise ConfigError(
            f"min_np={low} is more than the {size} task slots of this Spark cluster (num_proc={wanted})"
        )
    return size, low, high


def _reset_limit(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"reset_limit must be an integer >= 0 or None, got {value!r}")
    return value


def commit_directory(env: dict[str, str]) -> str:
    """The commit store's directory: the caller's HPCRING_ELASTIC_DIR, else a new one in /dev/shm."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return env.get(contract.DIRECTORY) or os.path.join(base, f"hpcring-spark-{uuid.uuid4().hex}")


class _Worlds:
    """The worlds of one run_elastic call: their sizes, the re-formations and their causes."""

    def __init__(self, sc: Any, low: int, high: int, elastic_timeout: float, reset_limit: int | None) -> None:
        self.sc, self.low, self.high = sc, low, high
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.resets = 0

    def next_size(self, cause: StageFailure) -> int:
        """Count a re-formation (SparkJobFailed past reset_limit) and size the next world from the slots
        the cluster has now (SparkJobFailed when fewer than min_np for longer than elastic_timeout)."""
        self.resets += 1
        if self.reset_limit is not None and self.resets > self.reset_limit:
            raise SparkJobFailed(
                f"hpcring.spark.run_elastic stopped: reset_limit={self.reset_limit} reached; the last world "
                f"was lost because {cause.error}",
                rank=cause.error.rank,
                task=cause.error.task,
            )
        count = options.wait_for_slots(self.sc, self.low, self.elastic_timeout)
        if count < self.low:
            raise SparkJobFailed(
                f"hpcring.spark.run_elastic: only {count} task slots, fewer than min_np={self.low}, for "
                f"longer than elastic_timeout={self.elastic_timeout:g} s after the world was lost "
                f"because {cause.error}"
            )
        return min(count, self.high)


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    nics: Any = None,
    prefix_output_with_timestamp: bool = False,
) -> list[Any]:
    """Run the elastic training function `fn(*args, **kwargs)` on Spark tasks until one world completes it;
    that world's results in rank order (docs/guide/spark.md)."""
    options.refuse_unsupported(
        "run_elastic",
        {
            "stdout": stdout,
            "stderr": stderr,
            "nics": nics,
        },
    )
    timeout = options.start_timeout(start_timeout)
    worlds_timeout = options.elastic_timeout(elastic_timeout)
    limit = _reset_limit(reset_limit)
    sc = spark_context()
    executors.check(sc, "hpcring.spark.run_elastic")
    size, low, high = _first_size(sc, num_proc, min_np, max_np)
    user_env = {
        **{str(k): str(v) for k, v in (env or {}).items()},
        **options.output_env(prefix_output_with_timestamp),
    }
    directory = commit_directory(user_env)
    base_env = {**user_env, contract.ELASTIC: "1", "HOROVOD_ELASTIC": "1", contract.DIRECTORY: directory}
    payload = pickled_call(fn, args, kwargs)
    worlds = _Worlds(sc, low, high, worlds_timeout, limit)
    stage = SparkStage(sc, "run_elastic")
    try:
        generation = 0
        while True:
            job = stage.job(
                size,
                f"world/{generation}",
                timeout,
                {**base_env, contract.GENERATION: str(generation)},
                remove_after=directory,
                stale_files=stage.stale_files,
            )
            started = time.monotonic()
            try:
                return stage.run(job, payload)
            except StageFailure as failure:
                if failure.kind == RAISED:
                    raise failure.error from failure.__cause__
                size = worlds.next_size(failure)
                if verbose:
                    why = str(failure.error).removeprefix("hpcring.spark.run_elastic: ")
                    print(
                        f"hpcring.spark.run_elastic: world {generation} ({job['size']} ranks) lost after "
                        f"{time.monotonic() - started:.1f} s: {why}; re-forming with {size} ranks",
                        flush=True,
                    )
                generation += 1
    finally:
        stage.close()
        shutil.rmtree(directory, ignore_errors=True)  # this host's part, also when the run failed
