"""`hpcring` command line: one small module per subcommand, imported only when that subcommand runs.

Each subcommand module defines `register(sub)` (adds its argparse parser) and `main(args) -> int`.
Errors derived from `HpcringError` are printed without a traceback; bad input exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hpcring import __version__
from hpcring.errors import ConfigError, HpcringError, JobShapeError, ProfileError

# name -> (module, one-line help). Modules are imported lazily: `hpcring profiles` never imports MPI or torch.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hpcring.cli.run", "launch a multi-rank job on this machine or the given hosts"),
    "doctor": ("hpcring.cli.doctor", "report MPI, torch, NCCL, GPUs and this host's topology"),
    "bench": ("hpcring.cli.bench", "benchmark collectives against raw MPI"),
    "profiles": ("hpcring.cli.profiles", "list, show and validate cluster profiles"),
    "map": ("hpcring.cli.map", "compute the per-rank CPU/GPU/NIC mapping of a job"),
    "render": ("hpcring.cli.render", "render a Slurm or LSF job script"),
    "submit": ("hpcring.cli.submit", "render and submit a job script"),
}

_USAGE_ERRORS = (ConfigError, ProfileError, JobShapeError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcring", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"hpcring {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in SUBCOMMANDS.items():
        # Parsers are registered lazily: only the chosen subcommand's module is imported.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints help / version / "invalid choice" listing the valid subcommands
        parser.print_help()
        return 2
    name = argv[0]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_parser = argparse.ArgumentParser(prog=f"hpcring {name}", description=SUBCOMMANDS[name][1])
    module.register(sub_parser)
    args = sub_parser.parse_args(argv[1:])
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
