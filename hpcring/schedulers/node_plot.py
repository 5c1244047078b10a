"""Draw a NodeDiagram with matplotlib (the `plot` extra): `hpcring map --plot FILE`.

Sockets are rows, NUMA domains boxes within them, each core a square coloured by its rank, and under each
domain the GPUs and NICs attached to it, coloured by the rank bound to them. Every core and device carries an
SVG id (`core-<n>-rank-<r>`, `core-<n>-idle`, `core-<n>-reserved`, `gpu-<label>-ranks-<r_r>`, `nic-...`) so
that a test, or a person with a browser's inspector, reads the layout back from the picture itself.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hpcring._deps import require
from hpcring.schedulers import cpuset
from hpcring.schedulers.node_diagram import Device, Domain, NodeDiagram

FORMATS = (".svg", ".png", ".pdf")
_COLS = 8  # cores per row inside a domain box: Frontier's and LUMI-G's L3 regions hold 8
_DEV_W = 3.2  # width of a GPU/NIC box, in core squares
_DEV_H = 1.6
_IDLE = "#ffffff"
_RESERVED = "#b0b0b0"
_SHARED = "#d9d9d9"


def rank_colour(rank: int, ranks: tuple[int, ...]) -> str:
    """A colour per rank of the node: tab10's then tab20's hues less their greys (grey marks reserved cores),
    then evenly spaced hues past 18 ranks."""
    import matplotlib

    i = ranks.index(rank)
    if len(ranks) <= 9:
        rgba = matplotlib.colormaps["tab10"]([c for c in range(10) if c != 7][i])
    elif len(ranks) <= 18:
        rgba = matplotlib.colormaps["tab20"]([c for c in range(20) if c not in (14, 15)][i])
    else:
        rgba = matplotlib.colormaps["hsv"](i / len(ranks))
    return str(matplotlib.colors.to_hex(rgba))


def save(diagram: NodeDiagram, path: Path) -> None:
    """Write the picture; the file's suffix (.svg, .png or .pdf) chooses the format."""
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"--plot {path}: the file must end in one of {', '.join(FORMATS)}")
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "hpcring"}):
        fig = _figure(diagram, plt)
        fig.savefig(path, bbox_inches="tight", metadata=_metadata(path))
        plt.close(fig)


def _metadata(path: Path) -> dict[str, Any] | None:
    # SVG and PDF record a creation date by default; leave it out so that a rendered layout is reproducible.
    return {"Date": None} if path.suffix.lower() in (".svg", ".pdf") else None


def _figure(d: NodeDiagram, plt: Any) -> Any:
    rows = _socket_rows(d)
    widths = [sum(_domain_width(dom) for dom in row) + 1.0 * (len(row) - 1) for row in rows]
    width = max([*widths, 24.0])
    heights = [max(_domain_height(dom) for dom in row) for row in rows]
    legend_h = 1.0 * math.ceil(len(d.ranks) / 2) + 1.5
    extra_h = 3.5 if d.unattached else 0.0
    height = sum(heights) + 1.5 * len(rows) + extra_h + legend_h
    scale = 0.3
    fig = plt.figure(figsize=(max(width * scale, 6.0), max(height * scale, 3.0)))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.5, width + 0.5)
    ax.set_ylim(-height, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(d.title, fontsize=10, y=1.02)
    y = 0.0
    for row, h in zip(rows, heights, strict=True):
        _draw_socket(ax, d, row, y, h)
        y -= h + 1.5
    if d.unattached:
        ax.text(0, y + 0.2, "devices without a documented NUMA domain", fontsize=7, va="bottom")
        _draw_devices(ax, d, d.unattached, 0.0, y - 0.3)
        y -= extra_h
    _draw_legend(ax, d, y)
    return fig


def _socket_rows(d: NodeDiagram) -> list[list[Domain]]:
    sockets = sorted({dom.socket for dom in d.domains})
    return [[dom for dom in d.domains if dom.socket == s] for s in sockets]


def _domain_width(dom: Domain) -> float:
    cores = max(min(_COLS, len(dom.cores)), 1)
    return max(float(cores), len(dom.devices) * (_DEV_W + 0.3)) + 1.0


def _domain_height(dom: Domain) -> float:
    core_rows = math.ceil(len(dom.cores) / _COLS)
    return core_rows + 2.0 + (_DEV_H + 0.6 if dom.devices else 0.0)


def _draw_socket(ax: Any, d: NodeDiagram, row: list[Domain], y: float, h: float) -> None:
    from matplotlib.patches import Rectangle

    width = sum(_domain_width(dom) for dom in row) + 1.0 * (len(row) - 1)
    ax.add_patch(Rectangle((-0.4, y - h - 0.4), width + 0.8, h + 0.8, fill=False, lw=1.5, ec="#333333"))
    ax.text(-0.3, y + 0.5, f"socket {row[0].socket}", fontsize=8, weight="bold", va="bottom")
    x = 0.0
    for dom in row:
        _draw_domain(ax, d, dom, x, y - 0.2)
        x += _domain_width(dom) + 1.0


def _draw_domain(ax: Any, d: NodeDiagram, dom: Domain, x: float, y: float) -> None:
    from matplotlib.patches import Rectangle

    w = _domain_width(dom)
    h = _domain_height(dom) - 0.4
    ax.add_patch(Rectangle((x, y - h), w, h, fill=True, fc="#f4f4f4", ec="#777777", lw=1.0))
    label = "no NUMA data" if dom.numa is None else f"NUMA {dom.numa}"
    ax.text(x + 0.3, y - 0.15, label, fontsize=7, va="top")
    for i, cell in enumerate(dom.cores):
        cx = x + 0.5 + (i % _COLS)
        cy = y - 1.6 - (i // _COLS)
        if cell.reserved:
            colour, gid, text = _RESERVED, f"core-{cell.core}-reserved", "×"
        elif cell.rank is None:
            colour, gid, text = _IDLE, f"core-{cell.core}-idle", ""
        else:
            colour, gid, text = (
                rank_colour(cell.rank, d.ranks),
                f"core-{cell.core}-rank-{cell.rank}",
                str(cell.rank),
            )
        patch = Rectangle((cx, cy), 0.92, 0.92, fc=colour, ec="#555555", lw=0.4)
        patch.set_gid(gid)
        ax.add_patch(patch)
        ax.text(cx + 0.46, cy + 0.46, text, fontsize=5, ha="center", va="center")
    if dom.devices:
        core_rows = math.ceil(len(dom.cores) / _COLS)
        _draw_devices(ax, d, dom.devices, x + 0.5, y - 1.6 - core_rows - 0.3)


def _draw_devices(ax: Any, d: NodeDiagram, devices: tuple[Device, ...], x: float, top: float) -> None:
    from matplotlib.patches import FancyBboxPatch

    for i, dev in enumerate(devices):
        dx = x + i * (_DEV_W + 0.3)
        if len(dev.ranks) == 1:
            colour = rank_colour(dev.ranks[0], d.ranks)
        else:
            colour = _SHARED if dev.ranks else _IDLE
        style = "round,pad=0.05" if dev.kind == "gpu" else "square,pad=0.05"
        patch = FancyBboxPatch(
            (dx, top - _DEV_H), _DEV_W, _DEV_H, boxstyle=style, fc=colour, ec="#333333", lw=0.8
        )
        ranks = "_".join(str(r) for r in dev.ranks) or "none"
        patch.set_gid(f"{dev.kind}-{dev.label.replace(' ', '')}-ranks-{ranks}")
        ax.add_patch(patch)
        who = "rank " + ",".join(str(r) for r in dev.ranks) if dev.ranks else "unused"
        ax.text(
            dx + _DEV_W / 2, top - _DEV_H / 2, f"{dev.label}\n{who}", fontsize=5.5, ha="center", va="center"
        )


def _draw_legend(ax: Any, d: NodeDiagram, y: float) -> None:
    """One line per rank: its colour, cores, GPUs and NICs: the table a person checks the picture against."""
    from matplotlib.patches import Rectangle

    devices = [dev for dom in d.domains for dev in dom.devices] + list(d.unattached)
    half = math.ceil(len(d.ranks) / 2)
    for i, rank in enumerate(d.ranks):
        lx = 0.0 if i < half else 13.0
        ly = y - 0.5 - (i % half) * 1.0
        ax.add_patch(
            Rectangle((lx, ly - 0.35), 0.7, 0.7, fc=rank_colour(rank, d.ranks), ec="#555555", lw=0.4)
        )
        owned = [dev.label for dev in devices if rank in dev.ranks]
        cores = cpuset.format_list(d.cores_of(rank)) or "-"
        text = f"rank {rank}: cores {cores}" + (f"; {', '.join(owned)}" if owned else "")
        ax.text(lx + 1.0, ly, text, fontsize=6.5, va="center")
