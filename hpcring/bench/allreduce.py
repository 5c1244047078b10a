"""`hpcring bench allreduce`: an nccl-tests style sweep of hpcring's allreduce algorithms against raw MPI.

Runs as a rank program (every rank executes it; rank 0 prints). For each size, dtype and algorithm it times
`hpcring.allreduce` on preallocated buffers, and raw mpi4py `Comm.Allreduce` on the very same buffers in the
same run (row `mpi4py-raw`), so the ratio between them is not blurred by load that changes between runs.
Time is the median iteration on each rank, then the maximum over ranks; algbw = bytes / time and busbw =
algbw * 2(n-1)/n (the nccl-tests convention: the bandwidth each link must sustain); vs-raw = raw MPI's time /
this row's time at the same size and dtype (above 1: faster than raw MPI). Every result is checked against the
exact expected sum (#wrong counts wrong elements over all ranks).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hpcring._deps import mpi, require
from hpcring.collective import dtypes
from hpcring.collective.arrays import bfloat16
from hpcring.collective.selection import ALGORITHMS
from hpcring.errors import ConfigError, choices

RAW = "mpi4py-raw"
NDArray = np.ndarray[Any, Any]
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Row:
    """One measured cell of the table."""

    size: int  # bytes
    count: int
    dtype: str
    algorithm: str
    time_us: float
    algbw: float  # GB/s (1e9 bytes/s)
    busbw: float
    wrong: int
    vs_raw: float | None = None  # mpi4py-raw's time / this row's time at the same size and dtype (>1: faster)


def parse_size(text: str) -> int:
    """'8', '64K', '256M', '1G' (powers of 1024) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ConfigError(f"bad size {text!r}; allowed: a number of bytes with an optional K, M or G suffix")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Sizes from min to max, multiplying by `factor` (nccl-tests -b/-e/-f)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ConfigError(f"bad size range {min_bytes}..{max_bytes}; allowed: 1 <= min <= max")
    if factor < 2:
        raise ConfigError(f"step factor {factor} is invalid; allowed: an integer >= 2")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def parse_list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """Comma-separated choices, each checked against `allowed`."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise ConfigError(f"bad {what} {text!r}; allowed (comma-separated): {choices(allowed)}")
    return items


def bus_factor(n: int) -> float:
    """busbw / algbw for allreduce: 2(n-1)/n."""
    return 2 * (n - 1) / n if n > 1 else 1.0


def numpy_dtype(name: str) -> np.dtype[Any]:
    """numpy dtype for a table name (bfloat16 from ml_dtypes)."""
    return bfloat16() if name == "bfloat16" else np.dtype(name)


def pattern(count: int, rank: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Rank's input: small integers, so the sum over ranks is exact in every dtype (even int8 and
    bfloat16)."""
    return ((np.arange(count) % 5) + (rank % 3)).astype(dtype)


def expected(count: int, size: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Exact elementwise sum of `pattern` over ranks 0..size-1."""
    offset = sum(r % 3 for r in range(size))
    return ((np.arange(count) % 5) * size + offset).astype(dtype)


def _time_loop(comm: Any, fn: Callable[[], None], iters: int, warmup: int) -> float:
    """Median seconds of `iters` barrier-separated calls on this rank, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def _operation(label: str, comm: Any, x: NDArray, out: NDArray, validate: bool) -> Callable[[], None]:
    """One timed call: raw mpi4py Allreduce, or hpcring's allreduce with the given algorithm."""
    import hpcring.collective as hc

    MPI = mpi()
    if label == RAW:
        return lambda: comm.Allreduce(x, out, MPI.SUM)
    return lambda: hc.allreduce(x, out=out, algorithm=label, validate=validate)


def cells(
    sizes: Sequence[int], dtype_names: Sequence[str], algorithms: Sequence[str], *, raw: bool, one_node: bool
) -> list[tuple[str, int, str]]:
    """The sweep's cells in order: (dtype, element count, algorithm or RAW). Raw MPI has no half types and
    `shm` needs every rank on one node."""
    out = []
    for name in dtype_names:
        itemsize = numpy_dtype(name).itemsize
        for size in sizes:
            count = size // itemsize
            if count == 0:
                continue
            labels = [RAW] if raw and name not in dtypes.HALF else []
            labels += [a for a in algorithms if a != "shm" or one_node]
            out += [(name, count, label) for label in labels]
    return out


def measure(
    sizes: Sequence[int],
    dtype_names: Sequence[str],
    algorithms: Sequence[str],
    *,
    iters: int,
    warmup: int,
    raw: bool = True,
    validate: bool = True,
    progress: Callable[[int], Any] | None = None,
) -> list[Row]:
    """Run the sweep on the initialised hpcring world; every rank returns the same rows. `progress(total)`
    gives a tqdm-like bar that is advanced once per cell and closed at the end."""
    import hpcring.collective as hc

    topo = hc.topology()
    comm, n = topo.comm, topo.size
    MPI = mpi()
    plan = cells(sizes, dtype_names, algorithms, raw=raw, one_node=len(topo.node_sizes) == 1)
    bar = progress(len(plan)) if progress else None
    rows: list[Row] = []
    buffers: tuple[str, int, NDArray, NDArray, NDArray] | None = None
    for name, count, label in plan:
        dt = numpy_dtype(name)
        if buffers is None or buffers[:2] != (name, count):
            x = pattern(count, topo.rank, dt)
            buffers = (name, count, x, expected(count, n, dt), np.empty_like(x))
        _, _, x, want, out = buffers
        nbytes = count * dt.itemsize
        if bar is not None:
            bar.set_description_str(f"{name} {nbytes} B {label}")
        out.fill(0)
        t = _time_loop(comm, _operation(label, comm, x, out, validate), iters, warmup)
        wrong = int(np.count_nonzero(out != want))
        t_max = comm.allreduce(t, op=MPI.MAX)
        wrong_all = comm.allreduce(wrong, op=MPI.SUM)
        algbw = nbytes / t_max / 1e9 if t_max > 0 else 0.0
        rows.append(Row(nbytes, count, name, label, t_max * 1e6, algbw, algbw * bus_factor(n), wrong_all))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return with_ratios(rows)


def with_ratios(rows: Sequence[Row]) -> list[Row]:
    """Each row with `vs_raw` filled in where the same size and dtype has a raw MPI row (None elsewhere)."""
    raw = {(r.size, r.dtype): r.time_us for r in rows if r.algorithm == RAW}
    out = []
    for r in rows:
        base = raw.get((r.size, r.dtype))
        out.append(replace(r, vs_raw=base / r.time_us if base is not None and r.time_us > 0 else None))
    return out


def format_table(rows: Sequence[Row]) -> str:
    """nccl-tests style fixed-width table."""
    head = f"{'size':>12} {'count':>12} {'type':>9} {'algorithm':>13} {'time(us)':>11} "
    head += f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'vs-raw':>7} {'#wrong':>7}"
    lines = ["#" + head[1:]]
    for r in rows:
        ratio = "-" if r.vs_raw is None else f"{r.vs_raw:.2f}x"
        lines.append(
            f"{r.size:>12} {r.count:>12} {r.dtype:>9} {r.algorithm:>13} {r.time_us:>11.1f} "
            f"{r.algbw:>11.3f} {r.busbw:>11.3f} {ratio:>7} {r.wrong:>7}"
        )
    return "\n".join(lines)


def write_json(path: Path, rows: Sequence[Row], header: dict[str, Any]) -> None:
    """Machine-readable results: the run's header plus one object per row."""
    path.write_text(json.dumps({**header, "results": [asdict(r) for r in rows]}, indent=2) + "\n")


def plot(path: Path, rows: Sequence[Row], title: str) -> None:
    """busbw against size, one line per dtype and algorithm (matplotlib imported only here)."""
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    keys = sorted({(r.dtype, r.algorithm) for r in rows})
    for dt, alg in keys:
        pts = [(r.size, r.busbw) for r in rows if r.dtype == dt and r.algorithm == alg]
        style = "--" if alg == RAW else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"{alg} ({dt})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def progress_printer(enabled: bool) -> Callable[[int], Any] | None:
    """A progress bar on stderr for a sweep of `total` cells (tqdm), shown only on a terminal and cleared at
    the end; None when not `enabled` (every rank but the lead)."""
    if not enabled:
        return None
    from tqdm import tqdm

    def bar(total: int) -> Any:
        return tqdm(total=total, file=sys.stderr, leave=False, disable=None, unit="cell", dynamic_ncols=True)

    return bar


def algorithm_choices() -> list[str]:
    """Names accepted by -a."""
    return list(ALGORITHMS)
