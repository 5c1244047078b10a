"""`hpcring run --horovod` and HPCRING_HOROVOD end to end: real launcher, real ranks, a Horovod script.

The script (horovod_program.py) imports `horovod` at its top; each launch checks every rank's line, with
the sum of ranks computed from the world size. Refusals are checked to start nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, RunRanks

from hpcring.contracts.horovod_alias import SITE_DIR

pytest.importorskip("torch")

PROGRAM = str(Path(__file__).with_name("horovod_program.py"))
ELASTIC_PROGRAM = str(Path(__file__).with_name("horovod_elastic_program.py"))


def _lines(out: str, np: int) -> None:
    """Every rank printed its line: its rank, the size, the sum of all ranks, hpcring's objects."""
    for rank in range(np):
        expected = (
            f"horovod-script rank={rank} size={np} sum={np * (np - 1) // 2} run=True "
            "error=hpcring.errors from=hpcring.torch.allreduce_ops"
        )
        assert expected in out, out


def _shell(python: str) -> list[str]:
    """A rank command that is not Python: the launcher cannot run it through hpcring's pyrun."""
    return ["sh", "-c", f'exec "{python}" "$0"', PROGRAM]


def test_horovod_flag_runs_a_horovod_script(hpcring_run: RunRanks) -> None:
    """At 4 ranks (the ranked suite tests/ranked/horovod_alias runs 1, 2 and 4 under --horovod too)."""
    done = hpcring_run(4, ["{python}", PROGRAM], extra=["--horovod"])
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 4)


def test_horovod_flag_under_mpich(hpcring_run: RunRanks) -> None:
    done = hpcring_run(2, ["{python}", PROGRAM], flavour="mpich", extra=["--horovod"])
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 2)


def test_horovod_flag_runs_an_elastic_horovod_script(hpcring_run: RunRanks) -> None:
    """`--horovod` with `--min-np`: the elastic driver's worlds import horovod too, and Horovod's elastic
    API (TorchState, @hvd.elastic.run, commit) runs to the end on every rank with the same weights."""
    hosts = "127.0.0.1:1,127.0.0.2:1"
    extra = ["--horovod", "-H", hosts, "--min-np", "2", "--max-np", "2"]
    done = hpcring_run(2, ["{python}", ELASTIC_PROGRAM], extra=extra, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "horovod-elastic " in line]
    assert len(lines) == 2, done.stdout + done.stderr
    for rank in range(2):
        assert any(f"rank={rank} size=2 steps=5 " in line for line in lines), lines
    assert len({line.rsplit("wsum=", 1)[1] for line in lines}) == 1, lines


def test_horovod_flag_covers_a_shell_wrapped_rank(hpcring_run: RunRanks) -> None:
    done = hpcring_run(2, _shell(sys.executable), extra=["--horovod"])
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 2)


def test_env_twin_is_the_flag(hpcring_run: RunRanks) -> None:
    """HPCRING_HOROVOD=1 alone: the shell-wrapped rank imports horovod, so the launcher set its PYTHONPATH."""
    done = hpcring_run(2, _shell(sys.executable), env={"HPCRING_HOROVOD": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 2)


def test_without_the_flag_horovod_is_not_there(hpcring_run: RunRanks) -> None:
    done = hpcring_run(1, ["{python}", PROGRAM], env={"HPCRING_HOROVOD": ""})
    assert done.returncode != 0
    assert "No module named 'horovod'" in done.stdout + done.stderr


def _fake_horovod(tmp_path: Path) -> Path:
    """A `horovod` package of the test's own, standing where a real installation would be found."""
    pkg = tmp_path / "site" / "horovod"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.28.1'\n")
    return pkg.parent


@pytest.mark.parametrize("how", ["flag", "env"])
def test_refuses_when_a_real_horovod_is_importable(hpcring_run: RunRanks, tmp_path: Path, how: str) -> None:
    marker = tmp_path / "started"
    site = _fake_horovod(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", str(ROOT))])}
    if how == "env":
        env["HPCRING_HOROVOD"] = "1"
    cmd = ["{python}", "-c", f"open({str(marker)!r}, 'w')"]
    done = hpcring_run(2, cmd, extra=["--horovod"] if how == "flag" else [], env=env, timeout=60)
    assert done.returncode != 0
    assert not marker.exists()  # refused before launching anything
    message = done.stderr.strip().splitlines()
    assert len(message) == 1, done.stderr
    assert "a real Horovod is installed" in message[0] and str(site / "horovod") in message[0]


_LAUNCHER_VARIABLES = ("OMPI_", "PMIX_", "HPCRING_RANK", "HPCRING_SIZE")


def _without_launcher_variables(env: dict[str, str]) -> dict[str, str]:
    """A process of its own (an MPI singleton), whatever launched this pytest."""
    return {k: v for k, v in env.items() if not k.startswith(_LAUNCHER_VARIABLES)}


def test_the_variable_alone_under_pyrun() -> None:
    """What hpcring.run's ranks and `srun python -m hpcring.launch.pyrun` have: HPCRING_HOROVOD=1 and no
    site folder; pyrun imports hpcring before the script, which installs the alias."""
    env = _without_launcher_variables({**os.environ, "HPCRING_HOROVOD": "1", "PYTHONPATH": str(ROOT)})
    done = subprocess.run(
        [sys.executable, "-m", "hpcring.launch.pyrun", PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 1)


def test_plain_interpreter_with_the_site_folder(tmp_path: Path) -> None:
    """No launcher (as under srun or mpirun): HPCRING_HOROVOD=1 and the site folder first on PYTHONPATH.
    A sitecustomize already on the path still runs after the alias's."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    chained = tmp_path / "chained"
    (theirs / "sitecustomize.py").write_text(f"open({str(chained)!r}, 'w').write('ran')\n")
    path = os.pathsep.join([SITE_DIR, str(theirs), str(ROOT)])
    env = _without_launcher_variables({**os.environ, "HPCRING_HOROVOD": "1", "PYTHONPATH": path})
    done = subprocess.run(
        [sys.executable, PROGRAM], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _lines(done.stdout, 1)
    assert chained.read_text() == "ran"
