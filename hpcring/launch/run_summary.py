"""The line `hpcring run` ends a successful job with: ranks, wall time, and the straggler when there is one.

A rank's time runs from the moment the launcher released it (every rank had checked in) to its wrapper's exit
report, so start-up skew between hosts does not count against a rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from hpcring.durations import duration

# A rank is named as the slowest only when it took this much longer than the median, and at least
# STRAGGLER_MIN_S more: on a short job, scheduling noise alone exceeds a few per cent.
STRAGGLER_RATIO = 1.05
STRAGGLER_MIN_S = 0.1


def summary(ranks: int, wall_s: float, times: Mapping[int, tuple[str, float]]) -> str:
    """`4 ranks finished in 12.3 s` and, when one rank took markedly longer than the median,
    `; slowest rank 2 on node7: 12.1 s, 9 % over the median 11.1 s`. `times`: rank -> (host, seconds)."""
    line = f"hpcring run: {ranks} rank{'s' if ranks != 1 else ''} finished in {duration(wall_s)}"
    if len(times) < 2:
        return line
    median = statistics.median(t for _, t in times.values())
    rank, (host, slowest) = max(times.items(), key=lambda item: (item[1][1], -item[0]))
    if slowest > median * STRAGGLER_RATIO and slowest - median >= STRAGGLER_MIN_S:
        over = (slowest / median - 1) * 100 if median > 0 else float("inf")
        line += (
            f"; slowest rank {rank} on {host}: {duration(slowest)}, {over:.0f} % over the median "
            f"{duration(median)}"
        )
    return line
