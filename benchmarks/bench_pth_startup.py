"""Start-up cost of the `hpcring-horovod-alias.pth` file when HPCRING_HOROVOD is unset.

    python benchmarks/bench_pth_startup.py VENV_PYTHON [--runs 400]

VENV_PYTHON is the Python of an environment where hpcring is installed (so its site-packages holds the
`.pth`); the script moves the file aside and back between runs of `VENV_PYTHON -c pass`, alternating, and
prints both medians and their ratio (the peer is the same interpreter without the file). It renames a file in
that environment: use a scratch venv. The last record is in docs/dev/torch.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NAME = "hpcring-horovod-alias.pth"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("python", help="the Python of an environment where hpcring is installed")
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    purelib = subprocess.run(
        [args.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    on, off = Path(purelib) / NAME, Path(purelib) / (NAME + ".off")
    if not on.exists():
        sys.exit(f"{on} not found: install hpcring into that environment first")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HPCRING_HOROVOD")}

    def once() -> float:
        start = time.perf_counter()
        subprocess.run([args.python, "-c", "pass"], env=env, check=True)
        return time.perf_counter() - start

    with_pth, without = [], []
    try:
        for _ in range(args.runs):
            on.rename(off)
            without.append(once())
            off.rename(on)
            with_pth.append(once())
    finally:
        if off.exists():
            off.rename(on)
    a, b = statistics.median(with_pth), statistics.median(without)
    print(
        f"python -c pass, {args.runs} runs each, alternating: median with the .pth {a * 1e3:.2f} ms, "
        f"without {b * 1e3:.2f} ms, ratio {a / b:.3f}"
    )


if __name__ == "__main__":
    main()
