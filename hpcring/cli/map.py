"""`hpcring map`: the per-rank CPU/GPU/NIC placement of a job, as a table, JSON, ERF, rankfile, or srun,
mpiexec or flux run flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("table", "json", "erf", "rankfile", "srun", "mpiexec", "flux")


def register(parser: argparse.ArgumentParser) -> None:
    from hpcring.cli import job_flags
    from hpcring.cli.flag_values import env

    job_flags.add_shape_args(parser)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=env("HPCRING_MAP_FORMAT") or "table",
        help="output format: a table, JSON records, or a launcher's own notation; default table "
        "[HPCRING_MAP_FORMAT]",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        default=env("HPCRING_MAP_PLOT"),
        help="also draw one node of the mapping to FILE (.svg, .png or .pdf; the `plot` extra): "
        "sockets, NUMA domains and cores coloured by rank, with each rank's GPUs and NICs [HPCRING_MAP_PLOT]",
    )
    parser.add_argument(
        "--plot-node",
        metavar="N",
        type=int,
        default=int(env("HPCRING_MAP_PLOT_NODE") or 0),
        help="which node --plot draws, 0-based; default 0 [HPCRING_MAP_PLOT_NODE]",
    )


def table(rm: object) -> str:
    """Aligned text table, one rank per line."""
    from hpcring.schedulers import cpuset
    from hpcring.schedulers.mapping import RankMap

    assert isinstance(rm, RankMap)
    lines = [f"{'rank':>6} {'node':>5} {'local':>5}  {'gpus':<8} {'cpus':<28} nic"]
    for r in rm.ranks():
        s = r.slot
        gpus = ",".join(map(str, s.gpus)) or "-"
        cpus = cpuset.format_list(s.cpus)
        lines.append(f"{r.rank:>6} {r.node:>5} {s.local_rank:>5}  {gpus:<8} {cpus:<28} {s.nic or '-'}")
    return "\n".join(lines) + "\n"


def _plot(rm: object, path: Path, node: int) -> None:
    """Draw node `node` before printing anything, so that a bad --plot value fails before the table."""
    from hpcring.errors import ConfigError
    from hpcring.schedulers import node_diagram, node_plot
    from hpcring.schedulers.mapping import RankMap

    assert isinstance(rm, RankMap)
    try:
        diagram = node_diagram.build(rm, node)
        node_plot.save(diagram, path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    print(f"# wrote {path}: node {node}, ranks {diagram.ranks[0]}-{diagram.ranks[-1]}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    from hpcring.cli import job_flags
    from hpcring.schedulers import mapping, registry

    prof = job_flags.load_profile(args)
    rm = mapping.build(prof, job_flags.job_from_args(args))
    if args.plot:
        _plot(rm, Path(args.plot), args.plot_node)
    out = sys.stdout
    if args.format == "table":
        out.write(table(rm))
    elif args.format == "json":
        out.write("[\n" + ",\n".join(rm.json_lines()) + "\n]\n")
    elif args.format == "erf":
        out.write(registry.launcher("jsrun").map_text(rm, {}))
        print("# launch with: jsrun --erf_input FILE.erf COMMAND", file=sys.stderr)
    elif args.format == "rankfile":
        out.write(registry.launcher("mpirun").map_text(rm, {}))
        print(
            f"# launch with: mpirun -n {rm.shape.ranks} --map-by rankfile:FILE=FILE:HWTCPUS COMMAND",
            file=sys.stderr,
        )
    else:  # a launcher's own notation: srun flags, mpiexec flags and GPU wrapper, flux run flags
        out.write(registry.launcher(args.format).map_text(rm, {}))
    return 0
