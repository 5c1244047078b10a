"""hpcring.launch.rendezvous: independent one-process MPICH jobs form one world through the TCP store, and
the cases that cannot (plain singletons, Open MPI) are refused with the reason instead of failing deep
inside MPI. No Ray here: the processes are started by the test itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray_support import HERE, ROOT, mpich_env

from hpcring.errors import ConfigError, LaunchError
from hpcring.launch.rendezvous_store import StoreClient, StoreServer

pytestmark = pytest.mark.timeout(180)


def _env() -> dict[str, str]:
    return {**os.environ, **mpich_env(), "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}


def _mpiexec(env: dict[str, str]) -> str:
    return env.get("HPCRING_RAY_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec")


@pytest.mark.parametrize("size", [1, 2, 4])
def test_independent_jobs_form_one_world_in_rank_order(size: int) -> None:
    server = StoreServer("127.0.0.1")
    env = _env()
    try:
        procs = [
            subprocess.Popen(
                [
                    "timeout",
                    "-k",
                    "5",
                    "90",
                    _mpiexec(env),
                    "-n",
                    "1",
                    sys.executable,
                    str(HERE / "rendezvous_program.py"),
                    f"127.0.0.1:{server.port}",
                    server.token,
                    str(r),
                    str(size),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in reversed(range(size))  # start order does not decide ranks
        ]
        outputs = [p.communicate() for p in procs]
    finally:
        server.close()
    assert [p.returncode for p in procs] == [0] * size, [err for _, err in outputs]
    seen = sorted(json.loads(out.strip().splitlines()[-1])["rank"] for out, _ in outputs)
    assert seen == list(range(size))
    for out, _ in outputs:
        info = json.loads(out.strip().splitlines()[-1])
        assert info["size"] == size and info["sum"] == size * (size - 1) // 2
        assert info["local_size"] == size and info["local_rank"] == info["rank"]  # one machine


def _singleton(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["timeout", "-k", "5", "60", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_plain_mpich_singleton_is_refused_with_the_reason() -> None:
    env = {k: v for k, v in _env().items() if not k.startswith(("PMI_", "PMIX_"))}
    proc = _singleton("from hpcring.launch import rendezvous; rendezvous.check_support()", env)
    assert proc.returncode != 0
    assert "run each worker as `mpiexec -n 1 python ...`" in proc.stderr
    assert "issue #7805" in proc.stderr


def test_open_mpi_is_refused_with_the_reason() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MPI4PY_MPIABI", "LD_LIBRARY_PATH")}
    probe = _singleton("from mpi4py import MPI; print(MPI.Get_library_version())", env)
    if "Open MPI" not in probe.stdout:
        pytest.skip("this environment's mpi4py does not load Open MPI")
    proc = _singleton("from hpcring.launch import rendezvous; rendezvous.check_support()", env)
    assert proc.returncode != 0
    assert "needs MPICH; mpi4py loaded Open MPI" in proc.stderr


def test_the_store_refuses_a_wrong_token_and_times_out_by_key() -> None:
    server = StoreServer("127.0.0.1")
    try:
        good = StoreClient(f"127.0.0.1:{server.port}", server.token)
        good.set("a", "1")
        assert good.get("a", timeout=1) == "1"
        with pytest.raises(LaunchError, match=r"rendezvous key 'b' was not published within 0\.2 s"):
            good.get("b", timeout=0.2)
        bad = StoreClient(f"127.0.0.1:{server.port}", "wrong")
        with pytest.raises(LaunchError, match="refused get: bad token"):
            bad.get("a", timeout=1)
        good.close()
        bad.close()
    finally:
        server.close()
    with pytest.raises(ConfigError, match="is not 'host:port'"):
        StoreClient("nohost", "t")


def test_a_rank_outside_the_world_is_refused() -> None:
    from hpcring.launch import rendezvous

    with pytest.raises(ConfigError, match=r"rendezvous rank 3 is outside 0\.\.1"):
        rendezvous.form_world(None, 3, 2)  # type: ignore[arg-type]


def test_importing_hpcring_ray_loads_neither_ray_nor_mpi() -> None:
    code = (
        "import sys, hpcring.ray, hpcring.launch.rendezvous, hpcring.launch.rendezvous_store\n"
        "hpcring.ray.RayExecutor, hpcring.ray.ElasticRayExecutor\n"
        "print(sorted(m for m in ('ray', 'mpi4py.MPI', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=ROOT
    )
    assert proc.stdout.strip() == "[]"
