"""hpcring: run a PyTorch script on many ranks the Horovod way, and write the batch scripts that place them.

Each subcommand lives in its own module (`register(parser)` adds its flags, `main(args) -> int` runs it),
imported only when that subcommand runs, so `hpcring profiles` on a login node never loads MPI or torch.
Errors derived from `HpcringError` are printed as one line without a traceback; bad input exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hpcring import __version__
from hpcring.cli.help_text import HelpFormatter, epilog
from hpcring.errors import ConfigError, HpcringError, JobShapeError, ProfileError

DESCRIPTION = (
    "Run a PyTorch script on many ranks with a Horovod-compatible API (import hpcring.torch as hvd), "
    "and write batch job scripts whose per-rank CPU, GPU and NIC bindings come from the cluster's topology."
)


@dataclass(frozen=True)
class Subcommand:
    """A subcommand as a user meets it in `--help`: what it does in one line, and commands to copy."""

    module: str
    summary: str
    examples: tuple[str, ...]


# Modules are imported lazily: only the chosen subcommand's module is imported.
SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand(
        "hpcring.cli.run",
        "launch a multi-rank job on this machine or the given hosts",
        (
            "hpcring run -np 4 -- python train.py",
            "hpcring run -np 8 -H node1:4,node2:4 -- python train.py",
            "hpcring run -np 2 --dry-run -- python train.py",
            "hpcring run -np 4 --min-np 2 --host-discovery-script ./hosts.sh -- python train.py  # elastic",
        ),
    ),
    "doctor": Subcommand(
        "hpcring.cli.doctor",
        "report MPI, torch, NCCL, GPUs and this host's topology, and how to fix what is missing",
        ("hpcring doctor", "hpcring doctor --json --strict"),
    ),
    "bench": Subcommand(
        "hpcring.cli.bench",
        "benchmark collectives against raw MPI (run it under hpcring run, srun or mpiexec)",
        (
            "hpcring run -np 4 -- python -m hpcring bench allreduce -b 8 -e 4M -f 4",
            "hpcring bench allreduce -e 1M",
        ),
    ),
    "profiles": Subcommand(
        "hpcring.cli.profiles",
        "list, show and validate cluster profiles, or write one for this cluster (init)",
        (
            "hpcring profiles list",
            "hpcring profiles show frontier",
            "hpcring profiles init -o mysite.yaml",
            "hpcring profiles validate mysite.yaml",
        ),
    ),
    "map": Subcommand(
        "hpcring.cli.map",
        "show which node, CPUs, GPUs and NIC each rank of a job gets",
        (
            "hpcring map --profile frontier --nodes 2",
            "hpcring map --profile summit --nodes 1 --format erf",
            "hpcring map --profile frontier --nodes 2 --plot frontier.svg",
        ),
    ),
    "render": Subcommand(
        "hpcring.cli.render",
        "write a batch job script (Slurm, LSF, PBS Pro, Flux) or a Kubernetes MPIJob for a cluster profile",
        (
            "hpcring render --profile frontier --nodes 2 --account abc123 -- python train.py",
            "hpcring render --profile generic-pbs --nodes 4 --time 02:00:00 -o job.sh -- python train.py",
        ),
    ),
    "submit": Subcommand(
        "hpcring.cli.submit",
        "write a job script and submit it (sbatch, bsub, qsub, flux batch, or kubectl apply for an MPIJob)",
        (
            "hpcring submit --profile frontier --nodes 2 --account abc123 --dry-run -- python train.py",
            "hpcring submit --profile frontier --nodes 2 --account abc123 --wait -- python train.py",
        ),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcring",
        description=DESCRIPTION,
        epilog=epilog([*SUBCOMMANDS["run"].examples[:1], *SUBCOMMANDS["render"].examples[:1]])
        + "\n\n'hpcring COMMAND --help' tells more about each command.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hpcring {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        # Parsers are registered lazily: only the chosen subcommand's module is imported.
        sub.add_parser(name, help=command.summary, add_help=False)
    return parser


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The full parser of one subcommand (imports its module)."""
    command = SUBCOMMANDS[name]
    module = importlib.import_module(command.module)
    parser = argparse.ArgumentParser(
        prog=f"hpcring {name}",
        description=command.summary[0].upper() + command.summary[1:] + ".",
        epilog=epilog(command.examples),
        formatter_class=HelpFormatter,
    )
    module.register(parser)
    return parser


_USAGE_ERRORS = (ConfigError, ProfileError, JobShapeError)


# A closed pipe (`hpcring profiles list | head`) ends a command as SIGPIPE ends other tools: quietly, 141.
CLOSED_PIPE_STATUS = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its output ending in a closed pipe is not an error worth a traceback."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at exit (after --help's SystemExit too), where it cannot be caught
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE_STATUS


def _silence_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, which would raise on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints help / version / "invalid choice" listing the valid subcommands
        parser.print_help()
        return 2
    name = argv[0]
    module = importlib.import_module(SUBCOMMANDS[name].module)
    args = subcommand_parser(name).parse_args(argv[1:])
    try:
        return int(module.main(args))
    except _USAGE_ERRORS as exc:
        print(f"hpcring {name}: error: {exc}", file=sys.stderr)
        return 2
    except HpcringError as exc:
        print(f"hpcring {name}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
