"""RayExecutor on a real local Ray cluster: workers are Ray actors whose processes form one MPI world."""

from __future__ import annotations

from typing import Any

import pytest
import ray_programs as prog
import torch

from hpcring.errors import ConfigError
from hpcring.horovod_alias import install, uninstall
from hpcring.ray import RayExecutor
from hpcring.ray.world import CallFailed

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def executor(ray_cluster: Any) -> Any:
    made: list[RayExecutor] = []

    def make(**kwargs: Any) -> RayExecutor:
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown()


def test_two_workers_train_like_one_process_on_the_combined_batch(executor: Any) -> None:
    ex = executor(num_workers=2, cpus_per_worker=1)
    ex.start()
    results = ex.run(prog.train, kwargs={"steps": 5, "per_rank": 8, "seed": 3})
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["size"] for r in results} == {2}
    assert [r["local_rank"] for r in results] == [0, 1]  # one node: local ranks follow the ranks
    assert [r["env_rank"] for r in results] == ["0", "1"]  # the rank environment is filled in
    reference = prog.train(steps=5, per_rank=16, seed=3, distributed=False)["weights"]
    for got in (r["weights"] for r in results):
        for w, ref in zip(got, reference, strict=True):
            torch.testing.assert_close(w, ref, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(results[0]["weights"], results[1]["weights"], strict=True))


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_worker_gets_its_rank_at_each_world_size(executor: Any, size: int) -> None:
    ex = executor(num_workers=size, cpus_per_worker=0.5)  # 4 workers fit the 3-CPU test cluster
    ex.start()
    expected_sum = sum(r + 0.25 for r in range(size))
    assert ex.run(prog.rank_sum, args=[0.25]) == [(r, size, expected_sum) for r in range(size)]


def test_a_function_using_a_module_level_horovod_torch_runs_on_the_workers(executor: Any) -> None:
    """Horovod's Ray shape: `RayExecutor(settings, num_workers=2)`, `start()`, `run(train)`, train using the
    script's `import horovod.torch as hvd`; the workers get the alias from unpickling it (no horovod=True)."""
    # Imported here, not at the top: Ray's workers import this module for its other remote functions, and
    # tests/ is not on their path.
    from support import horovod_script_train

    install()
    try:
        train = horovod_script_train()
        ex = executor(num_workers=2, cpus_per_worker=1)
        ex.start()
        results = ex.run(train, args=[2.0])
    finally:
        uninstall()
    assert results == [(r, 2, 2.0, "horovod.torch") for r in range(2)]


def test_horovod_setting_lets_workers_import_horovod(ray_cluster: Any) -> None:
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60, horovod=True), num_workers=2)
    try:
        ex.start()
        got = ex.run(prog.horovod_rank_sum, args=[0.5])
    finally:
        ex.shutdown()
    assert got == [(r, 2, 2.0, "hpcring.torch.allreduce_ops") for r in range(2)]  # 0.5 + 1.5


def test_execute_run_remote_and_execute_single_with_an_executable(executor: Any, ray_cluster: Any) -> None:
    ex = executor(num_workers=2)
    ex.start(executable_cls=prog.Counter, executable_args=[10])
    assert ex.execute(lambda counter: counter.bump(1)) == [11, 12]
    refs = ex.run_remote(prog.rank_sum, args=[0.5])
    assert ray_cluster.get(refs) == [(0, 2, 2.0), (1, 2, 2.0)]  # 0.5 + 1.5
    assert ex.execute_single(lambda counter: counter.value) == 11
    seen: list[Any] = []
    assert ex.run(prog.rank_sum, args=[1.0], callbacks=[seen.append]) == [(0, 2, 3.0), (1, 2, 3.0)]
    assert seen == [(0, 2, 3.0)]


def test_a_failing_rank_is_named_and_the_others_do_not_hang(executor: Any) -> None:
    ex = executor(num_workers=2)
    ex.start()
    with pytest.raises(CallFailed, match="worker rank 1 failed; the other workers were ended") as info:
        ex.run(prog.fail_on, args=[1])
    assert isinstance(info.value.__cause__, ValueError)  # Ray re-raises the worker's own exception type
    assert "rank 1 fails on purpose" in str(info.value)
    with pytest.raises(ConfigError, match=r"call shutdown\(\), then start\(\) again"):
        ex.run(prog.rank_sum, args=[0.0])


def test_a_killed_actor_is_named_and_the_others_are_ended(executor: Any, ray_cluster: Any) -> None:
    ex = executor(num_workers=2)
    ex.start()
    with pytest.raises(CallFailed, match="worker rank 1 failed; the other workers were ended") as info:
        ex.run(prog.kill_own_actor_on, args=[1])
    assert isinstance(info.value.__cause__, ray_cluster.exceptions.RayActorError)


def test_workers_per_host_shape(executor: Any) -> None:
    ex = executor(num_hosts=1, num_workers_per_host=2)  # one bundle of 2 CPUs, STRICT_SPREAD over 1 node
    ex.start()
    assert ex.run(prog.rank_sum, args=[0.0]) == [(0, 2, 1.0), (1, 2, 1.0)]


def test_placement_that_cannot_fit_says_what_was_asked(ray_cluster: Any) -> None:
    settings = RayExecutor.create_settings(placement_group_timeout_s=2)
    ex = RayExecutor(settings, num_workers=5, cpus_per_worker=1)
    with pytest.raises(ConfigError, match=r"could not place 5 workers \(\{'CPU': 1.0\} each"):
        ex.start()
    ex.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of num_workers or num_hosts"),
        ({"num_workers": 2, "num_hosts": 1}, "exactly one of num_workers or num_hosts"),
        ({"num_workers": 0}, "num_workers must be a positive integer, got 0"),
        ({"num_hosts": 1, "num_workers_per_host": 0}, "num_workers_per_host must be a positive integer"),
        ({"num_workers": 1, "cpus_per_worker": -1}, "cpus_per_worker must be a number >= 0"),
        ({"num_workers": 1, "gpus_per_worker": 1}, "use_gpu is False"),
        ({"num_workers": 2, "min_workers": 1}, "use hpcring.ray.ElasticRayExecutor"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RayExecutor(RayExecutor.create_settings(), **kwargs)


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="timeout_s must be a positive number of seconds, got 0"):
        RayExecutor.create_settings(timeout_s=0)


def _inside_placement_group() -> tuple[Any, list[Any]]:
    import ray

    # The group holds 2 of the cluster's 3 CPUs: a new group of 2 could not be placed (5 s, then an error).
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=5), num_workers=2)
    ex.start()
    try:
        current = ray.util.get_current_placement_group()
        return current.id.hex(), ex.run(prog.rank_sum, args=[0.0])
    finally:
        ex.shutdown()


def test_started_inside_a_placement_group_it_uses_that_group(ray_cluster: Any) -> None:
    ray = ray_cluster
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready(), timeout=60)
    try:
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        task = ray.remote(num_cpus=0)(_inside_placement_group).options(scheduling_strategy=strategy)
        group_id, results = ray.get(task.remote(), timeout=200)
        assert group_id == pg.id.hex()
        assert results == [(0, 2, 1.0), (1, 2, 1.0)]
    finally:
        remove_placement_group(pg)
