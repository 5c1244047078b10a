"""Horovod's own Spark torch example, unchanged: `examples/spark/pytorch/pytorch_spark_mnist.py` from a
checkout of Horovod's repository, through the horovod alias, on a libsvm file of MNIST's shape made here.

Runs only when HPCRING_TEST_HOROVOD_REPO names Horovod's repository (a work tree, or a bare git directory
whose HEAD holds the example): the example is Horovod's code, not shipped here. The run is the example's own
command line (`--master local[2] --num-proc 2 --epochs 1`, `--batch-size 16` for the small file), in a
plain `python` with HPCRING_HOROVOD=1 and the alias's site folder on PYTHONPATH; its ranks use MPICH as the
Spark tests' executors do (conftest). It must print the test accuracy and exit 0.
"""

from __future__ import annotations

import bz2
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from ray_support import mpich_env
from support import ROOT

from hpcring.contracts.horovod_alias import SITE_DIR

EXAMPLE = "examples/spark/pytorch/pytorch_spark_mnist.py"
pytestmark = pytest.mark.timeout(900)


def _example(tmp_path: Path) -> Path:
    repo = os.environ.get("HPCRING_TEST_HOROVOD_REPO")
    if not repo:
        pytest.skip("HPCRING_TEST_HOROVOD_REPO does not name a checkout of Horovod's repository")
    work_tree = Path(repo) / EXAMPLE
    if work_tree.is_file():
        return work_tree
    text = subprocess.run(
        ["git", f"--git-dir={repo}", "show", f"HEAD:{EXAMPLE}"], capture_output=True, check=True, timeout=60
    ).stdout
    out = tmp_path / Path(EXAMPLE).name
    out.write_bytes(text)
    return out


def write_mnist_like(path: Path, rows: int, seed: int = 0) -> None:
    """MNIST's libsvm form, bz2-compressed: a label 0-9, then one-based `index:value` pairs of 784 pixels
    (sparse: about a fifth non-zero). Each class lights its own band of pixels, so there is something to
    learn."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        label = rng.randrange(10)
        band = range(label * 78 + 1, label * 78 + 79)
        pixels = {i: round(rng.uniform(0.5, 1.0), 3) for i in band if rng.random() < 0.8}
        pixels.update({i: round(rng.random(), 3) for i in rng.sample(range(1, 785), 80)})
        lines.append(f"{label} " + " ".join(f"{i}:{v}" for i, v in sorted(pixels.items())))
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


def test_horovods_spark_torch_example_runs_unchanged(tmp_path: Path) -> None:
    example = _example(tmp_path)
    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    write_mnist_like(data / "mnist.bz2", rows=800)
    env = {**os.environ, **mpich_env(), "HPCRING_HOROVOD": "1", "PYSPARK_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, str(ROOT), str(Path(__file__).parent)])
    args = ["--master", "local[2]", "--num-proc", "2", "--epochs", "1", "--batch-size", "16"]
    args += ["--data-dir", str(data), "--work-dir", str(work)]
    done = subprocess.run(
        ["timeout", "-k", "5", "840", sys.executable, str(example), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    accuracy = [line for line in done.stdout.splitlines() if line.startswith("Test accuracy:")]
    assert len(accuracy) == 1, done.stdout[-3000:]
    assert 0.0 <= float(accuracy[0].split(":")[1]) <= 1.0
