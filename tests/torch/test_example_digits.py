"""The README's main job: examples/train_digits.py under the real launcher at 1, 2 and 4 ranks.

Each run must reach at least 95% test accuracy in the default 12 epochs (what `make demo` runs), write the
metrics JSON and the checkpoint from rank 0 only, atomically (no temporary file left behind), and the
checkpoint must reload into a fresh model that scores exactly the reported accuracy.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from support import ROOT, RunRanks

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

EXAMPLE = ROOT / "examples" / "train_digits.py"


def _example_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accuracy_of_checkpoint(path: Path) -> float:
    """Score the saved weights on the test split in this process (no MPI needed)."""
    example = _example_module()
    state = torch.load(path, weights_only=True)
    model = example.make_model()
    model.load_state_dict(state["model"])
    model.eval()
    _, test = example.datasets(seed=42)
    x, y = test.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


@pytest.mark.mpi
@pytest.mark.parametrize("np", [1, 2, 4])
def test_digits_reaches_95_percent(hpcring_run: RunRanks, tmp_path: Path, np: int) -> None:
    metrics, checkpoint = tmp_path / "out" / "metrics.json", tmp_path / "out" / "model.pt"
    proc = hpcring_run(
        np,
        ["{python}", str(EXAMPLE), "--json-metrics", str(metrics), "--checkpoint", str(checkpoint)],
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(metrics.read_text())
    assert result["size"] == np and result["epochs"] == 12
    assert result["test_accuracy"] >= 0.95, result
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["metrics.json", "model.pt"]
    assert proc.stdout.count("test accuracy") == 12  # one line per epoch, from rank 0 only
    done = [line for line in proc.stdout.splitlines() if "]<stdout>:done: " in line]
    assert len(done) == 1 and f"12 epochs on {np} ranks" in done[0] and "samples/s" in done[0], done
    assert f"final accuracy {result['test_accuracy']:.4f}" in done[0]
    state = torch.load(checkpoint, weights_only=True)
    assert state["epoch"] == 12 and "state" in state["optimizer"]
    assert _accuracy_of_checkpoint(checkpoint) == pytest.approx(result["test_accuracy"], abs=1e-9)
