"""The Ray driver's check, before any actor starts, that Ray's workers can run hpcring's workers: their
Python imports hpcring's worker code, its mpi4py loads MPICH, and the `mpiexec` the actors start workers with
is MPICH's (`hpcring.launch.worker_python` says why MPICH).

Ray's workers on a node run the Python the node's Ray runs, which on the driver's own node is the driver's
environment; the check runs only when the driver's node is one of the cluster's, since a driver elsewhere (a
laptop attached to a remote cluster) says nothing about the cluster's Python. The actors check again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from hpcring.launch import worker_python

WORKER_MODULES = ("hpcring.ray.worker", "cloudpickle")
SOURCE = "the Ray driver's, which Ray's workers on this node run"
FIX = "run the driver, and Ray, from an environment that has both"


def _driver_hosts_workers(ray: Any) -> bool:
    here = ray.util.get_node_ip_address()
    return any(node.get("Alive") and node.get("NodeManagerAddress") == here for node in ray.nodes())


def workers_env(ray: Any, extra: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment with the job's runtime_env variables and the executor's own on top, as the
    actors (and the worker processes they start) get them."""
    runtime = ray.get_runtime_context().runtime_env or {}
    job_vars = {str(k): str(v) for k, v in (runtime.get("env_vars") or {}).items()}
    return {**os.environ, **job_vars, **extra}


def check(ray: Any, api: str, extra: Mapping[str, str]) -> None:
    """ConfigError, one line, when this node's Ray workers could not run hpcring's MPICH workers."""
    from hpcring.ray.actor import MPIEXEC_VARIABLE, mpich_mpiexec

    if not _driver_hosts_workers(ray):
        return
    env = workers_env(ray, extra)
    worker_python.require_mpich(api, sys.executable, SOURCE, env, WORKER_MODULES, FIX)
    mpich_mpiexec(env.get(MPIEXEC_VARIABLE) or None)
