"""`hpcring bench allreduce`: sweep allreduce sizes and algorithms against raw mpi4py (see hpcring.bench).

It is a rank program: `hpcring run -np 4 -- python -m hpcring bench allreduce -b 8 -e 256M -f 2`, or the same
under mpiexec/srun. Every flag also reads a default from an HPCRING_BENCH_* environment variable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpcring.cli.help_text import HelpFormatter, epilog
from hpcring.errors import ConfigError


def _env(name: str, default: str) -> str:
    return os.environ.get(f"HPCRING_BENCH_{name}", default)


def register(parser: argparse.ArgumentParser) -> None:
    """Add the `allreduce` benchmark and its flags."""
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    ar = sub.add_parser(
        "allreduce",
        help="allreduce sweep: hpcring algorithms vs raw mpi4py Allreduce",
        description="Time allreduce from --minbytes to --maxbytes on every rank of the job, with each "
        "hpcring algorithm and with raw mpi4py Allreduce, and print an nccl-tests style table (algbw, "
        "busbw, and vs-raw: raw MPI's time over the row's). Every flag also reads HPCRING_BENCH_<FLAG>.",
        epilog=epilog(
            (
                "hpcring run -np 4 -- python -m hpcring bench allreduce -b 8 -e 64M -f 4",
                "hpcring bench allreduce -a native,ring -d float32,bfloat16 --json out.json",
            )
        ),
        formatter_class=HelpFormatter,
    )
    ar.add_argument(
        "-b",
        "--minbytes",
        default=_env("MINBYTES", "8"),
        help="smallest size in bytes per rank, K/M/G suffixes; default 8 [HPCRING_BENCH_MINBYTES]",
    )
    ar.add_argument(
        "-e",
        "--maxbytes",
        default=_env("MAXBYTES", "64M"),
        help="largest size in bytes per rank, K/M/G suffixes; default 64M [HPCRING_BENCH_MAXBYTES]",
    )
    ar.add_argument(
        "-f",
        "--stepfactor",
        type=int,
        default=int(_env("STEPFACTOR", "2")),
        help="factor from one size to the next; default 2 [HPCRING_BENCH_STEPFACTOR]",
    )
    ar.add_argument(
        "-d",
        "--dtype",
        default=_env("DTYPE", "float32"),
        help="element types, comma-separated; default float32 [HPCRING_BENCH_DTYPE]",
    )
    ar.add_argument(
        "-a",
        "--algorithms",
        default=_env("ALGORITHMS", "native,ring,hierarchical,shm"),
        help="hpcring algorithms, comma-separated, of auto, native, ring, hierarchical, shm (shm runs only "
        "where every rank is on one node); default native,ring,hierarchical,shm [HPCRING_BENCH_ALGORITHMS]",
    )
    ar.add_argument(
        "-n",
        "--iters",
        type=int,
        default=int(_env("ITERS", "20")),
        help="timed iterations per size; default 20 [HPCRING_BENCH_ITERS]",
    )
    ar.add_argument(
        "-w",
        "--warmup",
        type=int,
        default=int(_env("WARMUP", "5")),
        help="untimed warm-up iterations per size; default 5 [HPCRING_BENCH_WARMUP]",
    )
    ar.add_argument(
        "--no-raw",
        action="store_true",
        default=_env("NO_RAW", "") == "1",
        help="leave out the raw MPI rows (and so vs-raw) [HPCRING_BENCH_NO_RAW]",
    )
    ar.add_argument(
        "--no-validate",
        action="store_true",
        default=_env("NO_VALIDATE", "") == "1",
        help="call allreduce with validate=False, as the engine does [HPCRING_BENCH_NO_VALIDATE]",
    )
    ar.add_argument(
        "--json",
        default=_env("JSON", "") or None,
        help="also write the results as JSON to this file (keys: docs/guide/cli.md) [HPCRING_BENCH_JSON]",
    )
    ar.add_argument(
        "--plot",
        default=_env("PLOT", "") or None,
        help="also draw busbw against size into this PNG [HPCRING_BENCH_PLOT]",
    )


def main(args: argparse.Namespace) -> int:
    """Run the sweep on every rank; rank 0 prints the table and writes the files."""
    from hpcring import __version__
    from hpcring._deps import mpi, require
    from hpcring.bench import allreduce as bench
    from hpcring.collective import dtypes, runtime

    if args.iters < 1 or args.warmup < 0:
        raise ConfigError(f"-n must be >= 1 and -w >= 0, got -n {args.iters} -w {args.warmup}")
    sizes = bench.sweep(bench.parse_size(args.minbytes), bench.parse_size(args.maxbytes), args.stepfactor)
    dtype_names = bench.parse_list(args.dtype, dtypes.SUPPORTED, "dtype")
    if "bool" in dtype_names:
        raise ConfigError("bool cannot be summed; benchmark a numeric dtype")
    algorithms = bench.parse_list(args.algorithms, bench.algorithm_choices(), "algorithm")
    if args.plot:
        require("matplotlib")  # fail before a long sweep, naming `pip install 'hpcring[plot]'`
    topo = runtime.init()
    lead = topo.rank == 0
    rows = bench.measure(
        sizes,
        dtype_names,
        algorithms,
        iters=args.iters,
        warmup=args.warmup,
        raw=not args.no_raw,
        validate=not args.no_validate,
        progress=bench.progress_printer(lead),
    )
    if not lead:
        return 1 if any(r.wrong for r in rows) else 0
    desc = topo.describe()
    library = mpi().Get_library_version().splitlines()[0].strip()
    header = {
        "hpcring": __version__,
        "mpi": library,
        "ranks": topo.size,
        "nodes": desc["node_sizes"],
        "emulated_nodes": desc["emulated"],
        "iters": args.iters,
        "warmup": args.warmup,
        "validate": not args.no_validate,
        "op": "sum",
    }
    print(f"# hpcring {__version__} allreduce benchmark, {topo.size} ranks, nodes {desc['node_sizes']}")
    print(f"# {library}")
    print(f"# iters {args.iters}, warmup {args.warmup}, time = max over ranks of the median iteration")
    print(bench.format_table(rows), flush=True)
    if args.json:
        bench.write_json(Path(args.json), rows, header)
    if args.plot:
        bench.plot(Path(args.plot), rows, f"allreduce, {topo.size} ranks, nodes {desc['node_sizes']}")
    wrong = sum(r.wrong for r in rows)
    if wrong:
        print(f"# {wrong} wrong elements", file=sys.stderr)
    return 1 if wrong else 0
