"""`RayExecutor`: Horovod's Ray job API (horovod/ray/runner.py) over hpcring's MPI engine.

Usage is Horovod's::

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train_fn, args=[config])   # one result per rank, in rank order
    executor.shutdown()

`start()` reserves a placement group, creates one actor per worker and has their worker processes form
one MPI world (docs/dev/ray.md). The training function calls `hvd.init()` as under `horovodrun`: it finds
hpcring already initialised over that world. `min_workers`/`max_workers` (Horovod's elastic v2 switch) are
served by `ElasticRayExecutor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hpcring.errors import ConfigError
from hpcring.ray import placement, preflight
from hpcring.ray._ray import ray_module, ray_submodule
from hpcring.ray.settings import MiniSettings, create_settings, horovod_env
from hpcring.ray.world import WorkerGroup


def call_with(fn: Callable[..., Any], args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> Any:
    """A function of the executable that calls `fn(*args, **kwargs)` (what `run` sends to every worker)."""
    a, kw = list(args or []), dict(kwargs or {})

    def call(_executable: Any) -> Any:
        return fn(*a, **kw)

    return call


def _run_callbacks(callbacks: Sequence[Callable[[Any], Any]] | None, value: Any) -> None:
    for callback in callbacks or ():
        callback(value)


class RayExecutor:
    """Runs functions on `num_workers` Ray actors that form one hpcring world (Horovod's signature)."""

    create_settings = staticmethod(create_settings)

    def __init__(
        self,
        settings: MiniSettings,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        use_current_placement_group: bool = True,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        cooldown_range: list[int] | None = None,
        elastic_timeout: int = 600,
        override_discovery: bool = True,
    ) -> None:
        del cooldown_range, elastic_timeout, override_discovery, reset_limit
        if min_workers is not None or max_workers is not None:
            raise ConfigError(
                "RayExecutor(min_workers=..., max_workers=...) is Horovod's elastic mode: use "
                "hpcring.ray.ElasticRayExecutor(settings, min_workers=..., max_workers=...) instead"
            )
        self.settings = settings
        self.shape = placement.make_shape(
            num_workers=num_workers,
            num_hosts=num_hosts,
            num_workers_per_host=num_workers_per_host,
            cpus_per_worker=cpus_per_worker,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_worker,
        )
        self.use_current_placement_group = use_current_placement_group
        self._group: WorkerGroup | None = None
        self._pg: Any = None
        self._own_pg = True

    @property
    def num_workers(self) -> int:
        return self.shape.num_workers

    @property
    def workers(self) -> list[Any]:
        """The actors, in rank order (Horovod exposes them too)."""
        return list(self._group.actors) if self._group is not None else []

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: dict[str, Any] | None = None,
        extra_env_vars: dict[str, Any] | None = None,
    ) -> None:
        """Place the actors, start their workers and form the world; `executable_cls(*args, **kwargs)` is
        built in every worker once the world exists (so its constructor may call `hvd.init()`)."""
        ray = ray_module()
        if self._group is not None:
            raise ConfigError("this RayExecutor is already started: call shutdown() first")
        env = {**horovod_env(self.settings), **{str(k): str(v) for k, v in (extra_env_vars or {}).items()}}
        preflight.check(ray, "hpcring.ray.RayExecutor", env)
        self._pg, self._own_pg = self._placement_group(ray), True
        if self._pg is None:
            self._pg = placement.reserve(self.shape, self.settings.placement_group_timeout_s)
        else:
            self._own_pg = False
        group = WorkerGroup(ray.util.get_node_ip_address())
        self._group = group
        try:
            group.actors = self._create_actors(ray)
            executable = (executable_cls, list(executable_args or []), dict(executable_kwargs or {}))
            group.form(executable, env, self.settings.timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _placement_group(self, ray: Any) -> Any:
        """The placement group this code already runs in (a Ray Tune trial's), when Horovod's
        `use_current_placement_group` asks for it and it has a bundle for every bundle we would reserve."""
        current = ray.util.get_current_placement_group() if self.use_current_placement_group else None
        if current is None:
            return None
        needed = len(self.shape.bundles())
        if len(current.bundle_specs) < needed:
            raise ConfigError(
                f"the current placement group has {len(current.bundle_specs)} bundles, {needed} are needed "
                "for this RayExecutor; pass use_current_placement_group=False to reserve a new one"
            )
        return current

    def _create_actors(self, ray: Any) -> list[Any]:
        from hpcring.ray.actor import remote_class

        strategies = ray_submodule("util.scheduling_strategies")

        remote = remote_class()
        res = self.shape.worker_resources()
        actors = [
            remote.options(
                num_cpus=res["CPU"],
                num_gpus=res.get("GPU", 0),
                scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=self.shape.bundle_of(i)
                ),
            ).remote()
            for i in range(self.shape.num_workers)
        ]
        nodes = ray.get([a.node_id.remote() for a in actors])
        return [actors[i] for i in placement.node_order(nodes)]

    def _started(self) -> WorkerGroup:
        if self._group is None:
            raise ConfigError("the RayExecutor is not started: call start() first")
        if not self._group.formed:
            raise ConfigError(
                "a failure ended this RayExecutor's workers: call shutdown(), then start() again"
            )
        return self._group

    def execute(
        self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], Any]] | None = None
    ) -> list[Any]:
        """`fn(executable)` on every worker; the results in rank order. `callbacks` get rank 0's result."""
        results = self._started().call(fn)
        _run_callbacks(callbacks, results[0])
        return results

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker; the results in rank order."""
        return self.execute(call_with(fn, args, kwargs), callbacks)

    def run_remote(
        self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """Start `fn(*args, **kwargs)` on every worker and return the Ray object refs (rank order) at once."""
        return self._started().submit(call_with(fn, args, kwargs))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(executable)` on the rank 0 worker only (it must not call collectives)."""
        ray = ray_module()
        return ray.get(self._started().actors[0].execute.remote(fn))

    def shutdown(self) -> None:
        """End the workers, kill the actors and release the placement group (idempotent)."""
        group, self._group = self._group, None
        if group is not None:
            group.close()
        pg, self._pg = self._pg, None
        if pg is not None and self._own_pg:
            placement.release(pg)
