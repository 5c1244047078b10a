"""`hpcring map`: the per-rank CPU/GPU/NIC placement of a job, as a table, JSON, ERF, rankfile, or srun,
mpiexec or flux run flags."""

from __future__ import annotations

import argparse
import sys

FORMATS = ("table", "json", "erf", "rankfile", "srun", "mpiexec", "flux")


def register(parser: argparse.ArgumentParser) -> None:
    from hpcring.cli import job_flags
    from hpcring.cli.flag_values import env

    job_flags.add_shape_args(parser)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=env("HPCRING_MAP_FORMAT") or "table",
        help="output format [HPCRING_MAP_FORMAT]",
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


def main(args: argparse.Namespace) -> int:
    from hpcring.cli import job_flags
    from hpcring.schedulers import mapping, registry

    prof = job_flags.load_profile(args)
    rm = mapping.build(prof, job_flags.job_from_args(args))
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
