"""Time mapping and rendering a whole Frontier-size job (9,408 nodes x 8 ranks = 75,264 ranks).

Target: under 2 s for map + render. Not a test (timings on a shared 2-core CI box are noisy); run it by hand:

    .venv/bin/python benchmarks/bench_mapping.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from hpcring.schedulers import jobscript, mapping, planner, profile
from hpcring.schedulers.job import JobSpec, Step
from hpcring.schedulers.launchers import jsrun, mpirun


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """Best wall time of `repeat` runs, in seconds (the least disturbed by other load)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def frontier(repeat: int) -> dict[str, float]:
    prof = profile.load("frontier")
    job = JobSpec(nodes=9408, account="bench", time_s=12 * 3600, steps=(Step(("python", "train.py")),))

    def map_only() -> mapping.RankMap:
        return mapping.build(prof, job)

    rm = map_only()
    assert rm.shape.ranks == 75264
    return {
        "map": best_of(repeat, map_only),
        "map+render script (srun)": best_of(
            repeat, lambda: jobscript.render(planner.build(mapping.build(prof, job), job))
        ),
        "map+json (all ranks)": best_of(repeat, lambda: ",\n".join(mapping.build(prof, job).json_lines())),
        "map+rankfile (all ranks)": best_of(repeat, lambda: mpirun.rankfile(mapping.build(prof, job))),
    }


def summit(repeat: int) -> dict[str, float]:
    prof = profile.load("summit")
    job = JobSpec(nodes=4608, account="bench", time_s=24 * 3600, steps=(Step(("python", "train.py")),))
    return {
        "map+ERF (27,648 ranks)": best_of(repeat, lambda: jsrun.erf(mapping.build(prof, job))),
        "map+render script with inline ERF": best_of(
            repeat, lambda: jobscript.render(planner.build(mapping.build(prof, job), job))
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for site, results in (("frontier 9408x8", frontier(args.repeat)), ("summit 4608x6", summit(args.repeat))):
        for what, seconds in results.items():
            flag = "" if seconds < 2.0 else "  (over the 2 s target)"
            print(f"{site:<16} {what:<36} {seconds * 1000:8.1f} ms{flag}")


if __name__ == "__main__":
    main()
