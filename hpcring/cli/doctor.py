"""`hpcring doctor`: what this machine offers hpcring, and what is missing with the command that fixes it.

Exit code 0 even when optional pieces are missing (the report says so); `--strict` (HPCRING_DOCTOR_STRICT)
exits 1 when anything is missing, for use in CI or job prologues.
"""

from __future__ import annotations

import argparse
import json
import os


def register(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's flags; each defaults from its HPCRING_* variable."""
    parser.add_argument(
        "--json",
        action="store_true",
        default=os.environ.get("HPCRING_DOCTOR_JSON", "") in ("1", "true", "yes"),
        help="print the report as JSON (keys: docs/guide/cli.md) [HPCRING_DOCTOR_JSON]",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        default=os.environ.get("HPCRING_DOCTOR_STRICT", "") in ("1", "true", "yes"),
        help="exit 1 when something is missing [HPCRING_DOCTOR_STRICT]",
    )


def main(args: argparse.Namespace) -> int:
    from hpcring.diagnostics import diagnose, format_text

    report = diagnose()
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_text(report))
    return 1 if args.strict and report.missing else 0
