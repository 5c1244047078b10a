"""Horovod's `horovod.spark.common.backend`: where a Spark estimator runs its training function.

`TorchEstimator(backend=SparkBackend(num_proc=2, ...))` is how Horovod's Spark examples set the number of
processes and `horovod.spark.run`'s options; a backend of the user's own (a `Backend` subclass) runs the
training function elsewhere. `SparkBackend` sends the ranks the `env` it is given (without
`CUDA_VISIBLE_DEVICES`, as Horovod's: the driver may hide GPUs from itself, not from the ranks). Unlike
Horovod's it does not send the driver's whole environment by default: hpcring's ranks run in the executors'
own Python worker processes, whose environment (their MPICH, their paths) is theirs, not the driver's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def default_num_proc() -> int:
    """The Spark cluster's task slots (`spark.default.parallelism`), as Horovod's default."""
    from hpcring.spark import options
    from hpcring.spark.runner import spark_context

    return options.slots(spark_context())


class Backend:
    """Runs the training function on every rank and says how many ranks there are (Horovod's interface)."""

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> list[Any]:
        """`fn(*args, **kwargs)` on every rank; the results in rank order."""
        raise NotImplementedError()

    def num_processes(self) -> int:
        """How many processes the training runs on."""
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the training function with `hpcring.spark.run` on `num_proc` Spark tasks.

    `**kwargs` go to `hpcring.spark.run` (Horovod's `horovod.spark.run` options, e.g. `start_timeout`,
    `stdout`, `prefix_output_with_timestamp`)."""

    def __init__(self, num_proc: int | None = None, env: dict[str, str] | None = None, **kwargs: Any) -> None:
        self._num_proc = num_proc or default_num_proc()
        self._env = env
        self._kwargs = kwargs

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> list[Any]:
        import hpcring.spark

        full_env = {**(self._env or {}), **(env or {})}
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        results: list[Any] = hpcring.spark.run(
            fn, args=args, kwargs=kwargs, num_proc=self._num_proc, env=full_env, **self._kwargs
        )
        return results

    def num_processes(self) -> int:
        return self._num_proc
