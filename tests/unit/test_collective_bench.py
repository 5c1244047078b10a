"""Benchmark helpers: size parsing, sweep, exact check pattern, table, JSON and plot output."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcring.bench import allreduce as bench
from hpcring.errors import ConfigError


def test_parse_size_and_sweep() -> None:
    assert bench.parse_size("8") == 8
    assert bench.parse_size("64K") == 65536
    assert bench.parse_size("256M") == 256 << 20
    assert bench.parse_size("1g") == 1 << 30
    with pytest.raises(ConfigError, match="K, M or G"):
        bench.parse_size("12X")
    assert bench.sweep(8, 64, 2) == [8, 16, 32, 64]
    assert bench.sweep(8, 100, 4) == [8, 32]
    with pytest.raises(ConfigError):
        bench.sweep(8, 64, 1)


def test_parse_list_checks_choices() -> None:
    assert bench.parse_list("native, ring", bench.algorithm_choices(), "algorithm") == ["native", "ring"]
    with pytest.raises(ConfigError, match="allowed \\(comma-separated\\): 'auto', 'native'"):
        bench.parse_list("tree", bench.algorithm_choices(), "algorithm")


@pytest.mark.parametrize("name", ["int8", "bfloat16", "float16", "float32", "int64"])
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_check_pattern_sums_exactly(name: str, n: int) -> None:
    dt = bench.numpy_dtype(name)
    total = np.sum([bench.pattern(1000, r, dt).astype(np.float64) for r in range(n)], axis=0)
    np.testing.assert_array_equal(total, bench.expected(1000, n, dt).astype(np.float64))


def test_bus_factor() -> None:
    assert bench.bus_factor(1) == 1.0
    assert bench.bus_factor(2) == 1.0
    assert bench.bus_factor(4) == 1.5


ROWS = [
    bench.Row(1024, 256, "float32", "mpi4py-raw", 10.0, 0.1, 0.15, 0),
    bench.Row(1024, 256, "float32", "ring", 12.5, 0.08, 0.12, 0),
    bench.Row(2048, 512, "float32", "ring", 20.0, 0.1, 0.15, 0),
]


def test_table_and_json(tmp_path: Path) -> None:
    rows = bench.with_ratios(ROWS)
    table = bench.format_table(rows).splitlines()
    assert table[0].split()[-3:] == ["busbw(GB/s)", "vs-raw", "#wrong"]
    assert table[1].split() == [
        "1024",
        "256",
        "float32",
        "mpi4py-raw",
        "10.0",
        "0.100",
        "0.150",
        "1.00x",
        "0",
    ]
    assert table[2].split()[-2:] == ["0.80x", "0"]  # raw's 10 us against ring's 12.5 us at the same size
    assert table[3].split()[-2:] == ["-", "0"]  # no raw row at 2048 bytes
    out = tmp_path / "r.json"
    bench.write_json(out, rows, {"ranks": 4})
    data = json.loads(out.read_text())
    assert data["ranks"] == 4 and data["results"][1]["algorithm"] == "ring"
    assert [r["vs_raw"] for r in data["results"]] == [1.0, 0.8, None]


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "busbw.png"
    bench.plot(out, ROWS, "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _parse(argv: list[str]) -> argparse.Namespace:
    from hpcring.cli import bench as cli

    parser = argparse.ArgumentParser(prog="hpcring bench")
    cli.register(parser)
    return parser.parse_args(argv)


def test_cli_flags_and_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _parse(["allreduce", "-b", "8", "-e", "256M", "-f", "4", "-d", "float16", "-a", "ring", "-n", "3"])
    assert (args.minbytes, args.maxbytes, args.stepfactor, args.dtype) == ("8", "256M", 4, "float16")
    assert (args.algorithms, args.iters, args.warmup, args.json) == ("ring", 3, 5, None)
    monkeypatch.setenv("HPCRING_BENCH_ITERS", "7")
    monkeypatch.setenv("HPCRING_BENCH_ALGORITHMS", "native")
    monkeypatch.setenv("HPCRING_BENCH_JSON", "out.json")
    args = _parse(["allreduce"])
    assert (args.iters, args.algorithms, args.json) == (7, "native", "out.json")


def test_cells_skip_raw_for_half_types_and_shm_across_nodes() -> None:
    plan = bench.cells([2, 8], ["float32", "float16"], ["ring", "shm"], raw=True, one_node=False)
    assert plan == [
        ("float32", 2, "mpi4py-raw"),  # 8 bytes: 2 float32 (2 bytes hold none, so that size is skipped)
        ("float32", 2, "ring"),
        ("float16", 1, "ring"),  # raw MPI has no half types
        ("float16", 4, "ring"),
    ]
    assert ("float32", 2, "shm") in bench.cells([8], ["float32"], ["shm"], raw=False, one_node=True)


def _bench_argv() -> list[str]:
    sweep = ["-b", "8", "-e", "2K", "-f", "16", "-n", "2"]
    return [sys.executable, "-m", "hpcring", "bench", "allreduce", *sweep]


def test_progress_bar_only_on_a_terminal_and_cleared() -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(_bench_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "/15 [" in text and "cell/s" in text  # 3 sizes x (raw + 4 algorithms)
    assert text.rstrip("\r").split("\r")[-1].strip() == ""  # the bar's line is blanked at the end
    assert "cell/s" not in out.decode()
    piped = subprocess.run(_bench_argv(), capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and "cell/s" not in piped.stderr
