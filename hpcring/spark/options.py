"""The parameters `hpcring.spark.run` and `run_elastic` share: Horovod's names, defaults and environment
variables, checked before anything starts, and the cluster's task slots that bound the number of processes."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from hpcring.errors import ConfigError

DEFAULT_START_TIMEOUT_S = 600
DEFAULT_ELASTIC_TIMEOUT_S = 600
REGISTER_WAIT_S = 10.0  # how long a short slot count is read again (executors still registering)

_UNSUPPORTED = {
    "use_mpi": "hpcring always runs over MPI: leave use_mpi unset or True",
    "use_gloo": "hpcring has no Gloo controller: leave use_gloo unset or False",
    "extra_mpi_args": "no mpirun is started (each task's worker is its own mpiexec -n 1)",
    "stdout": "the ranks' output goes to the Spark executors' output: only the driver's own sys.stdout "
    "(Horovod's default) is accepted",
    "stderr": "the ranks' output goes to the Spark executors' output: only the driver's own sys.stderr "
    "(Horovod's default) is accepted",
    "nics": "MPICH picks the network itself (docs/guide/spark.md)",
    "executable": "the workers run the executors' own Python (PYSPARK_PYTHON)",
}
# The values of those parameters that ask for nothing hpcring cannot do (Horovod's defaults, mostly).
_FINE: dict[str, tuple[Any, ...]] = {
    "use_mpi": (None, True),
    "use_gloo": (None, False),
}


def refuse_unsupported(api: str, chosen: dict[str, Any]) -> None:
    """ConfigError for the first of Horovod's launcher parameters (`chosen`: name → value given to `api`)
    set to something hpcring cannot honour. The driver's own sys.stdout/sys.stderr are Horovod's defaults
    for `stdout`/`stderr`: with a local master the ranks' output lands there (the executors are the
    driver's), on a cluster in the executors' logs, where Horovod would forward it (docs/guide/spark.md)."""
    fine_streams = {"stdout": (None, sys.stdout), "stderr": (None, sys.stderr)}
    for name, value in chosen.items():
        if name in fine_streams:
            if not any(value is ok for ok in fine_streams[name]):
                raise ConfigError(
                    f"hpcring.spark.{api}({name}={value!r}) is not supported: {_UNSUPPORTED[name]}"
                )
            continue
        if value not in _FINE.get(name, (None,)):
            raise ConfigError(f"hpcring.spark.{api}({name}={value!r}) is not supported: {_UNSUPPORTED[name]}")


def output_env(prefix_output_with_timestamp: Any) -> dict[str, str]:
    """What the ranks' workers need for Horovod's `prefix_output_with_timestamp` (they stamp their own
    lines: hpcring.ray.output_stamp)."""
    if not isinstance(prefix_output_with_timestamp, bool):
        raise ConfigError(
            f"prefix_output_with_timestamp must be True or False, got {prefix_output_with_timestamp!r}"
        )
    return {"HPCRING_OUTPUT_TIMESTAMP": "1"} if prefix_output_with_timestamp else {}


def _seconds(name: str, value: float | None, variable: str, default: float) -> float:
    if value is None:
        raw = os.environ.get(variable, str(default))
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{variable} must be a number of seconds, got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def start_timeout(value: float | None) -> float:
    """Seconds for a world to form: `value`, else HOROVOD_SPARK_START_TIMEOUT, else 600 (Horovod's)."""
    return _seconds("start_timeout", value, "HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT_S)


def elastic_timeout(value: float | None) -> float:
    """Seconds to wait for min_np slots after a world is lost: `value`, else HOROVOD_ELASTIC_TIMEOUT, else
    600 (Horovod's)."""
    return _seconds("elastic_timeout", value, "HOROVOD_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT_S)


def positive_int(name: str, value: int | None) -> int | None:
    """`value` unless it is set to something other than a positive integer (ConfigError naming `name`)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def slots(spark_context: Any) -> int:
    """The cluster's task slots now (every registered executor's cores)."""
    return int(spark_context.defaultParallelism)


def wait_for_slots(spark_context: Any, need: int, timeout: float) -> int:
    """The slot count once it reaches `need`, read every half second for up to `timeout` seconds; the last
    count read when it never does."""
    deadline = time.monotonic() + timeout
    count = slots(spark_context)
    while count < need and time.monotonic() < deadline:
        time.sleep(0.5)
        count = slots(spark_context)
    return count


def num_proc(spark_context: Any, value: int | None) -> int:
    """`num_proc` (default: the cluster's task slots), refused when the cluster cannot run that many tasks
    at once: a barrier stage would otherwise wait for slots that never come. Executors register after the
    session starts, so a count that is still short is read again for up to REGISTER_WAIT_S seconds."""
    positive_int("num_proc", value)
    if value is None:
        return slots(spark_context)
    count = wait_for_slots(spark_context, value, REGISTER_WAIT_S)
    if value > count:
        raise ConfigError(
            f"num_proc={value} is more than the {count} task slots of this Spark cluster "
            f"(sc.defaultParallelism, read for {REGISTER_WAIT_S:g} s): a barrier stage needs one free slot "
            "per process"
        )
    return value
