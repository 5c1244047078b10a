"""Run Horovod's own torch test files, unchanged, through `hpcring run --horovod`, and tabulate the results.

    python benchmarks/horovod_own_files.py HOROVOD [--only test_torch.py] [--timeout 900]

HOROVOD is a checkout of Horovod's repository (a work tree with `test/`, or a bare git directory such as the
`fetch` tool's snapshot, whose `test/` is extracted to a temporary folder first). The files run in place,
each from its own folder next to Horovod's `test/utils/`, as Horovod runs them; nothing is copied into
hpcring. Horovod's test requirements must be importable by this Python: `mock` (and `cloudpickle`, which
its helpers import). Not run in CI: it needs Horovod's repository. The last record is in docs/dev/torch.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (file under test/, world sizes): the torch files docs/dev/torch.md records.
FILES = (
    ("parallel/test_torch.py", (2,)),
    ("parallel/test_timeline.py", (2,)),
    ("single/test_torch_elastic.py", (1, 2)),
    ("parallel/test_adasum_pytorch.py", (2, 4)),
)
SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:=* ?(\d+ (?:passed|failed|skipped|error).*) in [\d.]+s")
FAILED = re.compile(r"^\[(\d+)\]<stdout>:(FAILED|ERROR) (\S+)")


def test_tree(horovod: Path) -> Path:
    """Horovod's `test/` folder: in the work tree, or extracted from a bare git directory."""
    if (horovod / "test" / "utils" / "common.py").is_file():
        return horovod / "test"
    if (horovod / "HEAD").is_file() and (horovod / "objects").is_dir():
        out = Path(tempfile.mkdtemp(prefix="horovod-files-"))
        archive = subprocess.run(
            ["git", f"--git-dir={horovod}", "archive", "HEAD", "test"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
        return out / "test"
    raise SystemExit(f"{horovod}: neither a Horovod work tree (test/utils/common.py) nor a bare git dir")


def run_file(path: Path, np: int, timeout: float) -> tuple[str, list[str], float]:
    """(rank 0's summary, the failing test ids of any rank, seconds) of one file at `np` ranks."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "hpcring", "run", "--horovod", "-np", str(np), "--"]
    command += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", path.name]
    start = time.monotonic()
    try:
        out = subprocess.run(
            command, cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout, check=False
        ).stdout
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s", [], time.monotonic() - start
    summary = next((m[2] for line in out.splitlines() if (m := SUMMARY.match(line)) and m[1] == "0"), "")
    failed = sorted({f"{m[3]} (rank {m[1]})" for line in out.splitlines() if (m := FAILED.match(line))})
    return summary or "no summary from rank 0:\n" + out[-3000:], failed, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("horovod", type=Path, help="Horovod's repository: a work tree or a bare git dir")
    parser.add_argument("--only", help="run only the file of this name")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file and size")
    args = parser.parse_args()
    tree = test_tree(args.horovod.resolve())
    for relative, sizes in FILES:
        path = tree / relative
        if args.only and path.name != args.only:
            continue
        for np in sizes:
            summary, failed, seconds = run_file(path, np, args.timeout)
            print(f"{relative} at {np} rank(s), {seconds:.0f} s: {summary}", flush=True)
            for test in failed:
                print(f"    {test}", flush=True)


if __name__ == "__main__":
    main()
