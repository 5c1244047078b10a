"""ElasticRayExecutor on a real local Ray cluster: a worker's actor is killed mid-run and the run finishes
at the smaller size from the last commit, with the weights of a run that followed the same sizes."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import ray_programs as prog
import torch

from hpcring.errors import ConfigError
from hpcring.horovod_alias import install, uninstall
from hpcring.ray import ElasticRayExecutor
from hpcring.ray.world import CallFailed

pytestmark = pytest.mark.timeout(300)


def test_a_killed_worker_and_the_run_finishes_at_the_smaller_size(ray_cluster: Any, tmp_path: Path) -> None:
    steps, per_rank, seed, commit_every, kill_step = 9, 4, 5, 2, 5
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3, timeout_s=60, reset_limit=2)
    ex = ElasticRayExecutor(
        settings, cpus_per_slot=1, env_vars={"HPCRING_ELASTIC_DIR": str(tmp_path / "commits")}
    )
    ex.start()
    fn = functools.partial(
        prog.elastic_train, steps, per_rank, seed, commit_every, 2, kill_step, str(tmp_path)
    )
    started = time.time()
    results = ex.run(fn)
    total = time.time() - started
    assert ex.sizes == [3, 2] and ex.resets == 1
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["size"] for r in results} == {2} and {r["generation"] for r in results} == {1}
    # Steps up to the last commit before the kill ran at 3 workers, the rest (the lost step redone) at 2.
    last_commit = kill_step - kill_step % commit_every
    expected_sizes = [3] * last_commit + [2] * (steps - last_commit)
    assert all(r["sizes"] == expected_sizes for r in results)
    reference = prog.schedule_reference(expected_sizes, per_rank, seed)
    for r in results:
        for w, ref in zip(r["weights"], reference, strict=True):
            torch.testing.assert_close(w, ref, rtol=1e-5, atol=1e-6)
    recovery = results[0]["first_step_at"] - float((tmp_path / "killed").read_text())
    print(f"\nelastic ray: kill -> first step at size 2: {recovery:.2f} s; whole run {total:.2f} s")
    assert not (tmp_path / "commits").exists()  # the commit store is removed when the run is over


def test_a_horovod_elastic_function_using_a_module_level_horovod_torch(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Horovod's elastic Ray shape: `ElasticRayExecutor(settings)`, `start()`, `run(train)`, train using the
    script's `import horovod.torch as hvd` with a TorchState and `@hvd.elastic.run` (no horovod=True)."""
    from support import horovod_script_train  # not at the top: Ray workers import this module

    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=60)
    ex = ElasticRayExecutor(settings, env_vars={"HPCRING_ELASTIC_DIR": str(tmp_path / "commits")})
    install()
    try:
        train = horovod_script_train("elastic_train")
        ex.start()
        results = ex.run(functools.partial(train, 2.0))  # Horovod's run(worker_fn) takes no arguments
    finally:
        uninstall()
    assert results == [(r, 2, 2.0, "horovod.torch") for r in range(2)]


def test_the_functions_own_error_is_raised_not_retried(ray_cluster: Any, tmp_path: Path) -> None:
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=60)
    ex = ElasticRayExecutor(settings, env_vars={"HPCRING_ELASTIC_DIR": str(tmp_path / "commits")})
    ex.start()
    with pytest.raises(CallFailed, match="worker rank 0 failed") as info:
        ex.run(prog.raise_everywhere)
    assert isinstance(info.value.__cause__, KeyError)
    assert ex.resets == 0 and ex.sizes == [2]


def test_min_above_what_the_cluster_has_fails_after_elastic_timeout(ray_cluster: Any) -> None:
    settings = ElasticRayExecutor.create_settings(min_num_proc=5, elastic_timeout=2)
    ex = ElasticRayExecutor(settings)
    with pytest.raises(Exception, match="fewer than min_num_proc=5, for longer than elastic_timeout=2"):
        ex.start()
    ex.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_num_proc": 0}, "min_num_proc must be a positive integer, got 0"),
        ({"min_num_proc": 3, "max_num_proc": 2}, r"max_num_proc must be an integer >= min_num_proc \(3\)"),
        ({"reset_limit": -1}, "reset_limit must be an integer >= 0 or None"),
        ({"elastic_timeout": 0}, "elastic_timeout must be a positive number"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ElasticRayExecutor.create_settings(**kwargs)
