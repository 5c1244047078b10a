"""Which Python Spark's executors run for hpcring's tasks, and the driver's check that it can run them.

pyspark starts `python3` from the executors' PATH unless PYSPARK_PYTHON says otherwise; run from a virtual
environment that is not activated, that is another Python, without hpcring, and the task fails with
`No module named 'hpcring'` deep in a Java stack trace. So when neither PYSPARK_PYTHON nor
`spark.pyspark.python` names one, the executors get the driver's own Python (`sys.executable`), as
PYSPARK_PYTHON would give them: the SparkContext's `pythonExec`, which every Python function of the context
carries to the executors. Then, before any Spark job starts, that Python is asked whether it imports hpcring's
task code and loads MPICH (`hpcring.launch.worker_python`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hpcring.launch import worker_python as probe

PYSPARK_DEFAULT = "python3"  # SparkContext.pythonExec when PYSPARK_PYTHON was not set at its creation
TASK_MODULES = ("hpcring.spark.task", "cloudpickle", "numpy")
EXECUTOR_ENV = "spark.executorEnv."
FIX = "point PYSPARK_PYTHON (or spark.pyspark.python) at a Python that has it"


def worker_python(sc: Any) -> tuple[str, str]:
    """(the executors' Python, what chose it); sets the context's pythonExec when nothing chose one."""
    chosen = os.environ.get("PYSPARK_PYTHON")
    if chosen or sc.pythonExec != PYSPARK_DEFAULT:
        return sc.pythonExec, "PYSPARK_PYTHON" if chosen == sc.pythonExec else "SparkContext.pythonExec"
    conf = sc.getConf().get("spark.pyspark.python", None)
    if conf:
        sc.pythonExec = conf
        return conf, "spark.pyspark.python"
    sc.pythonExec = sys.executable
    return sys.executable, "the driver's own Python: neither PYSPARK_PYTHON nor spark.pyspark.python is set"


def executor_env(sc: Any) -> dict[str, str]:
    """The variables the executors' Python runs with, as far as the driver can tell: its own environment
    (a local cluster's executors inherit it) and the context's spark.executorEnv.* settings."""
    env = dict(os.environ)
    for key, value in sc.getConf().getAll():
        if key.startswith(EXECUTOR_ENV):
            env[key[len(EXECUTOR_ENV) :]] = value
    return env


def check(sc: Any, api: str) -> None:
    """ConfigError, one line, unless the executors' Python imports hpcring's task code and loads MPICH."""
    python, source = worker_python(sc)
    probe.require_mpich(api, python, source, executor_env(sc), TASK_MODULES, FIX)
