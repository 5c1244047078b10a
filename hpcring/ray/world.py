"""Driver side of a Ray job: actors in rank order, the rendezvous store, and calls supervised to the end.

`WorkerGroup.form` starts one worker process per actor and waits until they have formed one MPI world
(`hpcring.launch.rendezvous`, through a `StoreServer` in the driver). Every formation uses a fresh key, so
an elastic re-formation never reads the previous world's port. `call` runs a function on every worker and
returns the results in rank order; when one worker fails while others are still running, those others are
likely blocked in a collective waiting for it, so the whole world is ended (its processes killed) and the
error names the failing rank, instead of a job that hangs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hpcring.errors import LaunchError
from hpcring.launch.rendezvous_store import StoreServer
from hpcring.ray._ray import ray_module

# After one worker fails, how long the others get to finish on their own before the world is ended.
FAILURE_GRACE_S = 2.0


class CallFailed(RuntimeError):
    """A call failed on some ranks; `errors` maps each rank to what Ray raised for it."""

    def __init__(self, errors: dict[int, BaseException], ended_world: bool) -> None:
        first = min(errors)
        ended = "; the other workers were ended" if ended_world else ""
        super().__init__(f"worker rank {first} failed{ended}: {errors[first]}")
        self.errors = errors
        self.ended_world = ended_world
        self.rank = first


class WorkerGroup:
    """The actors of one job, in rank order, and the world their workers form."""

    def __init__(self, driver_address: str) -> None:
        self.actors: list[Any] = []
        self.info: dict[Any, dict[str, Any]] = {}  # per actor: its worker's pid, host, shared-memory files
        self.formed = False
        self._store = StoreServer()
        self._address = f"{driver_address}:{self._store.port}"
        self._generation = 0

    @property
    def size(self) -> int:
        return len(self.actors)

    def form(
        self,
        executable: tuple[Any, Sequence[Any], dict[str, Any]],
        env: dict[str, str],
        timeout: float,
        standby: bool = False,
    ) -> None:
        """Start every actor's worker and wait until they form one world (LaunchError names late ranks)."""
        ray = ray_module()

        self._generation += 1
        key = f"world/{self._generation}"
        self._store.clear("world/")
        specs = [
            {
                "rank": rank,
                "size": self.size,
                "store": self._address,
                "token": self._store.token,
                "key": key,
                "timeout": timeout,
                "executable": executable,
                "env": env,
                "standby": standby,
            }
            for rank in range(self.size)
        ]
        ray.get([a.start_worker.remote(spec, timeout) for a, spec in zip(self.actors, specs, strict=True)])
        refs = [a.ready.remote() for a in self.actors]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            late = [refs.index(r) for r in pending]
            self.end_world()
            raise LaunchError(
                f"workers of rank {late} did not join the world within {timeout:g} s (timeout_s)"
            )
        self._gather(refs, skip=[], ended=False)
        self.info = dict(zip(self.actors, ray.get(refs), strict=True))
        self.formed = True

    def submit(self, fn: Any) -> list[Any]:
        """Start `fn(executable)` on every worker; the object refs, in rank order."""
        if not self.formed:
            raise LaunchError("the workers are not running (never started, or a failure ended their world)")
        return [a.execute.remote(fn) for a in self.actors]

    def call(self, fn: Any) -> list[Any]:
        """`fn(executable)` on every worker; results in rank order, or CallFailed (see the module doc)."""
        return self.wait(self.submit(fn))

    def wait(self, refs: list[Any]) -> list[Any]:
        """Results of `refs` in rank order; on a failure the rest get a grace period, then the world ends."""
        ray = ray_module()

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            error = self._error(done[0])
            if error is None:
                continue
            # A dead actor's peers are stuck in a collective with it: no point waiting for them.
            grace = 0.0 if isinstance(error, ray.exceptions.RayActorError) else FAILURE_GRACE_S
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=grace)
            if pending:
                self.end_world(grace=0.2)
                self._drain(pending)
            self._gather(refs, skip=pending, ended=bool(pending))
        return list(ray.get(refs))

    @staticmethod
    def _drain(refs: list[Any]) -> None:
        """Collect the calls of workers this group ended (their errors are expected; Ray would otherwise
        log each one as unhandled)."""
        ray = ray_module()
        for ref in refs:
            try:
                ray.get(ref, timeout=15)
            except Exception:
                continue

    @staticmethod
    def _error(ref: Any) -> BaseException | None:
        ray = ray_module()
        try:
            ray.get(ref)
        except Exception as exc:
            return exc
        return None

    def _gather(self, refs: list[Any], *, skip: list[Any], ended: bool) -> None:
        """CallFailed with the error of every finished rank that failed (refs in `skip` still run)."""
        ray = ray_module()

        errors: dict[int, BaseException] = {}
        for rank, ref in enumerate(refs):
            if ref in skip:
                continue
            try:
                ray.get(ref)
            except Exception as exc:
                errors[rank] = exc
        if errors:
            raise CallFailed(errors, ended) from errors[min(errors)]

    def end_world(self, grace: float = 1.0) -> None:
        """Stop every worker process (actors stay); a dead actor is skipped."""
        ray = ray_module()

        self.formed = False
        refs = [a.stop_worker.remote(grace) for a in self.actors]
        ray.wait(refs, num_returns=len(refs), timeout=grace + 10)

    def close(self) -> None:
        """End the world, kill the actors, stop the store."""
        ray = ray_module()

        if self.actors:
            self.end_world()
            refs = [a.stop_standby.remote() for a in self.actors]
            ray.wait(refs, num_returns=len(refs), timeout=15)
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        self._store.close()


def wait_until(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    """Poll `predicate` until true or `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
