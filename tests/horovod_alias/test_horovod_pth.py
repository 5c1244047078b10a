"""`HPCRING_HOROVOD=1 python script.py` in any Python of the environment: the `.pth` file setup.py installs.

The install routes (a wheel, an editable install) must put `hpcring-horovod-alias.pth` at the root of
site-packages; the file's line must install the alias when the variable is set and import nothing when it
is not; a Ray worker started with the variable gets the alias with no hpcring code of its own running first
(its start-up cost is recorded in docs/dev/torch.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support import ROOT

PTH = ROOT / "hpcring" / "horovod_alias" / "hpcring-horovod-alias.pth"


def _pip(*args: str, cwd: Path) -> None:
    pytest.importorskip("setuptools", minversion="68")  # the build runs without isolation, on this one
    done = subprocess.run(
        [sys.executable, "-m", "pip", "-q", *args, "--no-deps", "--no-build-isolation"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_wheel_ships_the_pth_at_the_root_of_site_packages(tmp_path: Path) -> None:
    _pip("wheel", "-w", str(tmp_path), str(ROOT), cwd=tmp_path)
    (wheel,) = tmp_path.glob("hpcring-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(PTH.name) == PTH.read_bytes()


def test_an_editable_install_puts_the_pth_in_site_packages(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    _pip("install", "--prefix", str(prefix), "-e", str(ROOT), cwd=tmp_path)
    found = list(prefix.rglob(PTH.name))
    assert [p.parent.name for p in found] == ["site-packages"]
    assert found[0].read_bytes() == PTH.read_bytes()


def _interpreter_with_pth(
    tmp_path: Path, variable: str | None, code: str
) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that processes the .pth as site does for site-packages (`site.addsitedir`)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH.name).write_bytes(PTH.read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "HPCRING_HOROVOD"}
    env["PYTHONPATH"] = str(ROOT)
    if variable is not None:
        env["HPCRING_HOROVOD"] = variable
    prelude = f"import site, sys; site.addsitedir({str(site_dir)!r}); "
    command = [sys.executable, "-c", prelude + code]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("variable", ["1", "true", " On "])
def test_the_pth_installs_the_alias_when_the_variable_is_set(tmp_path: Path, variable: str) -> None:
    done = _interpreter_with_pth(tmp_path, variable, "import horovod.torch as hvd; print(type(hvd).__name__)")
    assert done.returncode == 0 and done.stdout.strip() == "AliasModule", done.stderr


@pytest.mark.parametrize("variable", [None, "", "0", "no"])
def test_the_pth_imports_nothing_without_the_variable(tmp_path: Path, variable: str | None) -> None:
    code = "print('hpcring' in sys.modules, any(m.startswith('horovod') for m in sys.modules))"
    done = _interpreter_with_pth(tmp_path, variable, code)
    assert done.returncode == 0 and done.stdout.split() == ["False", "False"], done.stderr


def _installed_pth() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH.name


@pytest.mark.skipif(
    not _installed_pth().exists(), reason="this environment's hpcring predates its .pth: run `make setup`"
)
def test_a_ray_worker_with_the_variable_imports_horovod(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A plain Ray task (no hpcring code runs before it), its worker started with HPCRING_HOROVOD=1."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),  # short: Ray's socket paths must fit 107 bytes
    )
    try:

        @ray.remote(runtime_env={"env_vars": {"HPCRING_HOROVOD": "1"}})
        def probe() -> tuple[str, bool]:
            import horovod.torch as hvd

            return type(hvd).__name__, hvd.allreduce.__module__.startswith("hpcring.")

        assert ray.get(probe.remote(), timeout=120) == ("AliasModule", True)
    finally:
        ray.shutdown()
