"""`hpcring bench allreduce` as a rank program under the launcher: table, checked results, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import RunRanks

pytestmark = pytest.mark.mpi


def test_bench_allreduce_sweep_writes_checked_results(hpcring_run: RunRanks, tmp_path: Path) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "busbw.png"
    cmd = ["{python}", "-m", "hpcring", "bench", "allreduce", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3"]
    cmd += ["-w", "1", "-a", "auto,native,ring,hierarchical", "-d", "float32,bfloat16"]
    cmd += ["--json", str(out), "--plot", str(png)]
    proc = hpcring_run(2, cmd, emulate_nodes=2, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "busbw(GB/s)" in proc.stdout and "mpi4py-raw" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ranks"] == 2 and data["nodes"] == [1, 1]
    rows = data["results"]
    sizes = {1024, 8192, 65536}
    for dtype, labels in (
        ("float32", {"mpi4py-raw", "auto", "native", "ring", "hierarchical"}),
        ("bfloat16", {"auto", "native", "ring", "hierarchical"}),
    ):
        got = {(r["size"], r["algorithm"]) for r in rows if r["dtype"] == dtype}
        assert got == {(s, a) for s in sizes for a in labels}
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["busbw"] == pytest.approx(r["algbw"]) for r in rows)
    assert png.read_bytes()[:4] == b"\x89PNG"
