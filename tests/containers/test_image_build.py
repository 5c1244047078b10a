"""The CPU image (containers/Dockerfile.cpu), built with podman once per session (conftest.py) and run.

Every container runs with `--network none` as the image's own non-root user: ranks wire up over loopback and
shared memory, as on one node. Opt-in (HPCRING_TEST_PODMAN=1, root; .ci/run sets it), skipped with the reason
otherwise. What they prove: the launcher and every collective work in the image, the digits example trains
to a sensible accuracy and rank 0 writes its checkpoint to a bind mount, the default command (the demo)
succeeds, and `hpcring render --image` produces a container command that the image's real entry point, PATH
and user run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from podman_images import BUILD_TIMEOUT, IMAGE, IMAGE_UID, Containers, output, run_rendered, writable_dir

# The first test also waits for the session's image build.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

IN_IMAGE = Path(__file__).resolve().parent / "in_image"
EPOCH = re.compile(r"^\[0\]<stdout>:epoch\s+(\d+)/\d+\s.*test accuracy ([0-9.]+)\s", re.M)


def test_collectives_two_ranks_as_image_user(containers: Containers) -> None:
    """allreduce (sum/average/max, 3 algorithms), uneven allgather, broadcast from root 1, alltoall with
    splits, uneven reducescatter: 2 ranks through `hpcring run` in the image, expectations from rank/size."""
    proc = containers.run(
        IMAGE,
        ["hpcring", "run", "-np", "2", "--", "python", "/tests/collectives.py"],
        options=["-v", f"{IN_IMAGE}:/tests:ro"],
        timeout=180,
    )
    assert proc.returncode == 0, output(proc)
    for rank in (0, 1):
        assert f"rank {rank}/2 uid {IMAGE_UID}: collectives ok in the image" in proc.stdout, output(proc)


def test_digits_example_trains_and_checkpoints(containers: Containers, tmp_path: Path) -> None:
    """2 ranks, 5 epochs of examples/train_digits.py in the image; rank 0 checkpoints to a bind mount."""
    import torch

    out = writable_dir(tmp_path / "out")
    epochs = 5
    command = ["hpcring", "run", "-np", "2", "--", "python", "/opt/hpcring/examples/train_digits.py"]
    command += ["--epochs", str(epochs), "--checkpoint", "/out/digits.pt"]
    command += ["--json-metrics", "/out/metrics.json"]
    proc = containers.run(IMAGE, command, options=["-v", f"{out}:/out"], timeout=300)
    assert proc.returncode == 0, output(proc)
    printed = [(int(e), float(a)) for e, a in EPOCH.findall(proc.stdout)]
    assert [e for e, _ in printed] == list(range(1, epochs + 1)), output(proc)
    # Seeded and deterministic: 2 ranks reach ~0.95 after 5 epochs; 0.90 leaves room for BLAS differences.
    assert printed[-1][1] >= 0.90, printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["size"] == 2 and metrics["epochs"] == epochs
    assert abs(metrics["test_accuracy"] - printed[-1][1]) < 1e-4, (metrics, printed)
    checkpoint = out / "digits.pt"
    assert checkpoint.stat().st_uid == IMAGE_UID  # written by the image's user, not root
    state = torch.load(checkpoint, weights_only=True)
    assert state["epoch"] == epochs
    assert tuple(state["model"]["0.weight"].shape) == (128, 64)
    assert tuple(state["model"]["4.bias"].shape) == (10,)
    assert state["optimizer"]["state"], "optimizer state (momentum buffers) missing from the checkpoint"


def test_default_command_runs_the_demo(containers: Containers) -> None:
    """No command: the image's CMD (2 ranks, 3 epochs of the digits example) must succeed."""
    proc = containers.run(IMAGE, timeout=300)
    assert proc.returncode == 0, output(proc)
    assert [int(e) for e, _ in EPOCH.findall(proc.stdout)] == [1, 2, 3], output(proc)


def test_rendered_command_runs_in_the_image(containers: Containers, tmp_path: Path) -> None:
    """The rank line of `hpcring render --image` (profile generic-slurm-gpu: `apptainer exec --nv --bind ...
    IMAGE python train.py`), runtime flags translated to podman, the rest untouched: the image has no
    ENTRYPOINT, so the command runs directly with the image's PATH (/opt/venv) and user."""
    metrics, skipped = run_rendered(containers, tmp_path, IMAGE, entrypoint=[])
    sys.stderr.write(f"\n[podman] rendered binds skipped (source absent here): {skipped}\n")
    assert metrics["size"] == 1 and metrics["epochs"] == 2
    assert float(str(metrics["test_accuracy"])) > 0.5, metrics
