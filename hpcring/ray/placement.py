"""Where the workers go: a Ray placement group reserving every worker's CPUs and GPUs before any starts.

Two shapes, as Horovod's strategies: `num_workers` packs one bundle per worker (Ray puts them on as few
nodes as fit); `num_hosts` x `num_workers_per_host` reserves one bundle per host with STRICT_SPREAD (one per
node, all workers of a host in its bundle), so every host runs the same number of workers. Ranks are then
ordered so that the workers of a node are consecutive (local ranks 0..k-1 on each node, as mpiexec does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcring.errors import ConfigError
from hpcring.ray._ray import ray_module, ray_submodule


@dataclass(frozen=True)
class Shape:
    """How many workers, how they spread over hosts, and what each one needs."""

    num_workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    num_hosts: int | None = None

    @property
    def workers_per_host(self) -> int:
        return self.num_workers // (self.num_hosts or 1)

    def worker_resources(self) -> dict[str, float]:
        res = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker:
            res["GPU"] = float(self.gpus_per_worker)
        return res

    def bundles(self) -> list[dict[str, float]]:
        one = self.worker_resources()
        if self.num_hosts is None:
            return [dict(one) for _ in range(self.num_workers)]
        return [{k: v * self.workers_per_host for k, v in one.items()} for _ in range(self.num_hosts)]

    def strategy(self) -> str:
        return "PACK" if self.num_hosts is None else "STRICT_SPREAD"

    def bundle_of(self, worker: int) -> int:
        """The bundle a worker draws its resources from."""
        return worker if self.num_hosts is None else worker // self.workers_per_host


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def make_shape(
    *,
    num_workers: int | None,
    num_hosts: int | None,
    num_workers_per_host: int,
    cpus_per_worker: float,
    use_gpu: bool,
    gpus_per_worker: float | None,
) -> Shape:
    """Check Horovod's sizing arguments together; ConfigError naming the field and what is allowed."""
    if (num_workers is None) == (num_hosts is None):
        raise ConfigError(
            "give exactly one of num_workers or num_hosts (with num_workers_per_host), "
            f"got num_workers={num_workers!r}, num_hosts={num_hosts!r}"
        )
    if (
        not isinstance(cpus_per_worker, int | float)
        or isinstance(cpus_per_worker, bool)
        or cpus_per_worker < 0
    ):
        raise ConfigError(f"cpus_per_worker must be a number >= 0, got {cpus_per_worker!r}")
    if gpus_per_worker and not use_gpu:
        raise ConfigError("gpus_per_worker is set but use_gpu is False: set use_gpu=True to reserve GPUs")
    gpus = float(gpus_per_worker or 1) if use_gpu else 0.0
    if use_gpu and gpus <= 0:
        raise ConfigError(f"gpus_per_worker must be > 0 with use_gpu=True, got {gpus_per_worker!r}")
    if num_hosts is not None:
        hosts = _positive_int("num_hosts", num_hosts)
        per_host = _positive_int("num_workers_per_host", num_workers_per_host)
        return Shape(hosts * per_host, float(cpus_per_worker), gpus, hosts)
    return Shape(_positive_int("num_workers", num_workers), float(cpus_per_worker), gpus)


def reserve(shape: Shape, timeout_s: float) -> Any:
    """A ready placement group for `shape`; ConfigError saying what was asked and what the cluster has."""
    ray = ray_module()
    pgs = ray_submodule("util.placement_group")
    pg = pgs.placement_group(shape.bundles(), strategy=shape.strategy())
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        pgs.remove_placement_group(pg)
        raise ConfigError(
            f"Ray could not place {shape.num_workers} workers ({shape.worker_resources()} each, "
            f"strategy {shape.strategy()}) within placement_group_timeout_s={timeout_s:g}; the cluster has "
            f"{ray.available_resources()} available"
        )
    return pg


def release(pg: Any) -> None:
    """Give the placement group's resources back to Ray."""
    ray_submodule("util.placement_group").remove_placement_group(pg)


def node_order(nodes: list[str]) -> list[int]:
    """Indices of `nodes` (one node id per worker) reordered so each node's workers are consecutive,
    nodes in order of their first worker: the rank each worker gets is its position in this list."""
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        first.setdefault(node, i)
    return sorted(range(len(nodes)), key=lambda i: (first[nodes[i]], i))
