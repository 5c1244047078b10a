"""One step of a multi-step job: records when this rank started and finished it.

Writes OUTDIR/STEP-rank-NNN.json = {"rank", "step", "start", "end"} (wall-clock seconds; every emulated node
is this host, so the clocks agree). Rank 0 works `--slow` seconds, every other rank almost nothing: if the
job's step boundary were not a real barrier, the fast ranks would start the next step long before rank 0 ended
this one. Needs no MPI: the rank comes from whichever launcher started us.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

RANK_VARS = ("HPCRING_RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")


def my_rank() -> int:
    """This process's world rank from the launcher's environment."""
    for var in RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    raise SystemExit(f"step_stamp.py: no rank variable set (looked at {', '.join(RANK_VARS)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("step")
    parser.add_argument("--slow", type=float, default=2.0, help="seconds rank 0 spends in the step")
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits 5 after its work")
    args = parser.parse_args()
    rank = my_rank()
    start = time.time()
    time.sleep(args.slow if rank == 0 else 0.05)
    end = time.time()
    stamp = {"rank": rank, "step": args.step, "start": start, "end": end}
    (args.outdir / f"{args.step}-rank-{rank:03d}.json").write_text(json.dumps(stamp))
    return 5 if rank == args.fail_rank else 0


if __name__ == "__main__":
    sys.exit(main())
