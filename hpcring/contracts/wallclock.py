"""What `hpcring run`, the batch scripts it is rendered into and the ranks agree on to train past a job's
wall clock: the warning signals, the exit codes and the variables (docs/guide/elastic.md, "Longer than the
wall clock"). Torch- and MPI-free: the launcher imports it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from hpcring.errors import ConfigError

# The ranks checkpointed on a warning and ask to be requeued: the batch script then calls the scheduler's
# requeue (Slurm `scontrol requeue`, LSF `brequeue`, ...). Distinct from the elastic RESET_EXIT_CODE (75),
# which asks `hpcring run` itself for a relaunch.
REQUEUE_EXIT_CODE = 85
# The ranks checkpointed on a warning but the requeue bound is reached: nothing to requeue, nothing failed;
# resubmitting with the same --checkpoint-dir continues.
STOPPED_EXIT_CODE = 86

CHECKPOINT_DIR = "HPCRING_CHECKPOINT_DIR"  # shared directory of the durable checkpoints (same on every host)
MAX_REQUEUES = "HPCRING_MAX_REQUEUES"  # "N" or "N,M": bound on time-limit (N) and preemption (M) requeues
DEFAULT_MAX_LIMIT_REQUEUES = 3  # as submitit: three time-outs; preemptions are not bounded

# A rendered batch script does not signal the ranks (a rank that has not yet installed its handler would die
# of SIGUSR1): its trap writes the kind to this file in the checkpoint directory, and rank 0 looks for it at
# every commit. The script removes it before it starts the ranks.
WARNING_FILE = "WARNING"

LIMIT, PREEMPT = "limit", "preempt"
# The warning a batch script forwards to `hpcring run`: SIGUSR1 before the time limit (the scheduler's
# pre-limit signal), SIGUSR2 when the job is being preempted (the script maps the scheduler's own).
WARNINGS: dict[int, str] = {int(signal.SIGUSR1): LIMIT, int(signal.SIGUSR2): PREEMPT}


def kind_of(signum: int) -> str | None:
    """LIMIT or PREEMPT for a warning signal, None for any other."""
    return WARNINGS.get(int(signum))


def read_warning(directory: str) -> str | None:
    """The kind a batch script's trap wrote to the warning file; None when there is none (or it holds
    anything but a kind: the file is read as hostile bytes)."""
    try:
        with open(os.path.join(directory, WARNING_FILE), "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if text in (LIMIT, PREEMPT) else None


def checkpoint_dir(env: Mapping[str, str] | None = None) -> str | None:
    """The job's durable checkpoint directory, or None when the job names none."""
    value = (os.environ if env is None else env).get(CHECKPOINT_DIR, "").strip()
    return value or None


def max_requeues(env: Mapping[str, str] | None = None) -> dict[str, int | None]:
    """The bound per kind: {LIMIT: 3, PREEMPT: None} unless HPCRING_MAX_REQUEUES says otherwise
    ("N": time limits; "N,M": time limits and preemptions; "none" for either: unbounded)."""
    raw = (os.environ if env is None else env).get(MAX_REQUEUES, "").strip()
    if not raw:
        return {LIMIT: DEFAULT_MAX_LIMIT_REQUEUES, PREEMPT: None}
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) > 2:
        raise ConfigError(f"{MAX_REQUEUES}={raw!r}: allowed: N, or N,M (N, M: integers >= 0 or 'none')")
    bounds = [_bound(p, raw) for p in parts]
    return {LIMIT: bounds[0], PREEMPT: bounds[1] if len(bounds) > 1 else None}


def _bound(text: str, raw: str) -> int | None:
    if text.lower() == "none":
        return None
    if not text.isdigit():
        raise ConfigError(f"{MAX_REQUEUES}={raw!r}: {text!r} is not an integer >= 0 or 'none'")
    return int(text)
