"""`ElasticRayExecutor`: Horovod's elastic Ray API (horovod/ray/elastic.py) on hpcring's restart-based
elastic training (`hpcring.torch.elastic`, docs/guide/elastic.md).

MPI cannot shrink a running world, so a world that loses a worker is ended and a new one is formed from
the live actors, plus new actors where Ray has room, between `min_num_proc` and `max_num_proc`. Each world's
workers are fresh processes; `@hvd.elastic.run` restores the newest commit from the node-local commit store
(HPCRING_ELASTIC_DIR) and calls the reset callbacks, exactly as under `hpcring run --min-np`. A world ends
when an actor dies (its slot is not used again: Ray's unit is the slot, where Horovod blacklists the host)
or a worker process ends by itself (`RESET_EXIT_CODE`, a failed collective); an exception the function
raises while its process and actor live is raised to the caller, as in a non-elastic run. `reset_limit`
bounds the re-formations; fewer than `min_num_proc` slots for longer than `elastic_timeout` ends the run
with an error (docs/guide/ray.md).
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from hpcring.contracts import elastic as contract
from hpcring.errors import ConfigError, LaunchError
from hpcring.ray import placement, preflight
from hpcring.ray._ray import ray_module
from hpcring.ray.actor import WorkerFailed, remote_class
from hpcring.ray.executor import call_with
from hpcring.ray.settings import ElasticSettings, create_elastic_settings, horovod_env
from hpcring.ray.world import CallFailed, WorkerGroup, wait_until

# How long a new actor may take to be scheduled before the slot counts as not available.
_ACTOR_START_S = 30.0


def _reset_cause(failure: CallFailed) -> str | None:
    """Why the world must re-form ('rank r: ...'), or None when the function itself raised."""
    ray = ray_module()
    for rank, exc in sorted(failure.errors.items()):
        if isinstance(exc, ray.exceptions.RayActorError):
            return f"the actor of rank {rank} died"
        if isinstance(exc, WorkerFailed | LaunchError):
            return f"rank {rank}: {exc}"
    return None


class ElasticRayExecutor:
    """Runs an elastic training function on Ray actors, re-forming the world when workers are lost."""

    create_settings = staticmethod(create_elastic_settings)

    def __init__(
        self,
        settings: ElasticSettings,
        use_gpu: bool = False,
        cpus_per_slot: float = 1,
        gpus_per_slot: float | None = None,
        env_vars: dict[str, Any] | None = None,
        override_discovery: bool = True,
    ) -> None:
        del override_discovery  # Ray's own resources are the discovery here
        if not isinstance(settings, ElasticSettings):
            raise ConfigError("settings must come from ElasticRayExecutor.create_settings(...)")
        self.settings = settings
        self.shape = placement.make_shape(
            num_workers=1,
            num_hosts=None,
            num_workers_per_host=1,
            cpus_per_worker=cpus_per_slot,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_slot,
        )
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.resets = 0
        self.sizes: list[int] = []  # the size of every world formed, in order
        self._lost = 0  # slots whose actor died: not used again by this job
        self._group: WorkerGroup | None = None
        self._commit_dir = ""

    def start(self) -> None:
        """Start the rendezvous store and wait (up to elastic_timeout) for min_num_proc slots."""
        ray = ray_module()
        if self._group is not None:
            raise ConfigError("this ElasticRayExecutor is already started")
        preflight.check(ray, "hpcring.ray.ElasticRayExecutor", self.env_vars)
        self._group = WorkerGroup(ray.util.get_node_ip_address())
        self._commit_dir = self.env_vars.get(contract.DIRECTORY) or os.path.join(
            "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(),
            f"hpcring-ray-{uuid.uuid4().hex}",
        )
        self._fill()

    # ------------------------------------------------------------------ slots and actors
    def _free_slots(self) -> int:
        free = ray_module().available_resources()
        slots = [math.floor(free.get(k, 0.0) / v) for k, v in self.shape.worker_resources().items() if v > 0]
        return max(0, min(slots, default=0) - self._lost)

    def _fill(self) -> None:
        """Add actors up to max_num_proc where Ray has free slots; wait for min_num_proc if short."""
        group = self._started()
        limit = self.settings.max_num_proc or 1 << 30
        need = self.settings.min_num_proc

        def enough() -> bool:
            self._add(min(limit - group.size, self._free_slots()))
            return group.size >= need

        if not wait_until(enough, self.settings.elastic_timeout, step=1.0):
            raise LaunchError(
                f"only {group.size} workers available, fewer than min_num_proc={need}, for longer than "
                f"elastic_timeout={self.settings.elastic_timeout:g} s ({self._lost} slots lost to failures)"
            )

    def _add(self, count: int) -> None:
        if count <= 0:
            return
        ray = ray_module()
        group = self._started()
        res = self.shape.worker_resources()
        remote = remote_class().options(num_cpus=res["CPU"], num_gpus=res.get("GPU", 0))
        new = [remote.remote() for _ in range(count)]
        refs = [a.node_id.remote() for a in new]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_ACTOR_START_S)
        for actor, ref in zip(new, refs, strict=True):
            if ref in ready:
                group.actors.append(actor)
            else:
                ray.kill(actor)
        nodes = ray.get([a.node_id.remote() for a in group.actors])
        group.actors = [group.actors[i] for i in placement.node_order(nodes)]

    def _drop_dead(self) -> None:
        """Forget actors that no longer answer; each one's slot is lost for this job."""
        ray = ray_module()
        group = self._started()
        refs = [a.pid.remote() for a in group.actors]
        alive, dead = [], []
        for actor, ref in zip(group.actors, refs, strict=True):
            try:
                ray.get(ref, timeout=_ACTOR_START_S)
                alive.append(actor)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self._lost += 1
                dead.append(actor)
                ray.kill(actor)
        group.actors = alive
        self._clean_after(dead, alive)

    def _clean_after(self, dead: list[Any], alive: list[Any]) -> None:
        """Have a live actor on a dead actor's host remove the shared-memory files its worker left."""
        group = self._started()
        hosts = {group.info.get(a, {}).get("host"): a for a in alive}
        for actor in dead:
            info = group.info.pop(actor, {})
            helper = hosts.get(info.get("host"))
            if helper is not None and info.get("shm"):
                helper.remove_files.remote(info["shm"])

    def _dead_actor(self) -> str | None:
        """'the actor of rank r died' for the first actor that no longer answers. A survivor can fail
        (its collective broke) before Ray reports the dead actor: then the loss, not that error, decides."""
        ray = ray_module()
        refs = [a.pid.remote() for a in self._started().actors]
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=_ACTOR_START_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return f"the actor of rank {rank} died"
        return None

    def _started(self) -> WorkerGroup:
        if self._group is None:
            raise ConfigError("the ElasticRayExecutor is not started: call start() first")
        return self._group

    # ------------------------------------------------------------------ running
    def _env(self, generation: int) -> dict[str, str]:
        return {
            **horovod_env(self.settings),
            **self.env_vars,
            contract.ELASTIC: "1",
            "HOROVOD_ELASTIC": "1",
            contract.DIRECTORY: self._commit_dir,
            contract.GENERATION: str(generation),
        }

    def run(
        self, worker_fn: Callable[[], Any], callbacks: Sequence[Callable[[Any], Any]] | None = None
    ) -> list[Any]:
        """Run `worker_fn()` on every worker until one world completes it; its results in rank order.

        `callbacks` get rank 0's result. Raises the function's own exception when it raised one, and
        RuntimeError past reset_limit."""
        group = self._started()
        generation = 0
        try:
            while True:
                self.sizes.append(group.size)
                try:
                    group.form((None, [], {}), self._env(generation), self.settings.timeout_s, standby=True)
                    results = group.call(call_with(worker_fn, None, None))
                except CallFailed as failure:
                    cause = _reset_cause(failure) or self._dead_actor()
                    if cause is None:
                        raise
                    self._reset(cause)
                    generation += 1
                    continue
                except LaunchError as exc:
                    self._reset(str(exc))
                    generation += 1
                    continue
                for callback in callbacks or ():
                    callback(results[0])
                return results
        finally:
            self._cleanup()

    def _reset(self, cause: str) -> None:
        """End the world, drop dead actors, count the reset, refill slots."""
        group = self._started()
        group.end_world()
        self.resets += 1
        limit = self.settings.reset_limit
        if limit is not None and self.resets > limit:
            raise RuntimeError(f"elastic run stopped: reset limit {limit} reached (last cause: {cause})")
        if self.settings.verbose:
            print(f"hpcring.ray elastic: re-forming the world: {cause}", flush=True)
        self._drop_dead()
        self._fill()

    def _cleanup(self) -> None:
        """Remove the commit files on the nodes of live actors; kill the actors; stop the store."""
        group, self._group = self._group, None
        if group is None:
            return
        group.end_world()
        ray = ray_module()
        refs = [a.remove_tree.remote(self._commit_dir) for a in group.actors]
        ray.wait(refs, num_returns=len(refs), timeout=10)
        group.close()

    def shutdown(self) -> None:
        """Kill the actors and stop the store (run() does this when it returns; idempotent)."""
        self._cleanup()
