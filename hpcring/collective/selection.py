"""Which allreduce algorithm runs: the per-call choice, the environment default, and the `auto` rule.

The `auto` rule is a pure function of the message size, whether MPI can reduce the dtype itself, and the node
layout, so it is unit-tested without MPI and documented (with the measurements behind its thresholds) in
docs/collectives.md. Every rank computes the same choice from the same agreed inputs.
"""

from __future__ import annotations

import os

from hpcring.errors import ConfigError, choices

ALGORITHMS: tuple[str, ...] = ("auto", "native", "ring", "hierarchical")
ALGORITHM_ENV = "HPCRING_ALLREDUCE_ALGORITHM"
CHUNK_ENV = "HPCRING_RING_CHUNK_BYTES"

# Thresholds of the auto rule (see docs/collectives.md, "How auto chooses").
HALF_RING_MIN_BYTES = 64 << 10  # float16/bfloat16 at least this big: our ring (no float32 widening)
HIERARCHICAL_MIN_BYTES = 1 << 20  # several nodes with several ranks each, at least this big: hierarchical


def resolve_algorithm(value: str | None) -> str:
    """The algorithm name asked for: the keyword, else $HPCRING_ALLREDUCE_ALGORITHM, else 'auto'."""
    source = "algorithm"
    if value is None:
        value = os.environ.get(ALGORITHM_ENV) or "auto"
        source = ALGORITHM_ENV
    if not isinstance(value, str) or value.strip().lower() not in ALGORITHMS:
        raise ConfigError(
            f"unknown allreduce algorithm {value!r} (from {source}); allowed: {choices(ALGORITHMS)}"
        )
    return value.strip().lower()


def choose_algorithm(nbytes: int, *, native_exact: bool, local_size: int, cross_size: int) -> str:
    """The `auto` rule.

    - float16/bfloat16 (MPI cannot add them, `native_exact` False): native widens to float32, doubling the
      bytes moved, so from HALF_RING_MIN_BYTES on our ring, which adds them in their own dtype, wins;
    - several nodes, each with several ranks, and a big message: hierarchical sends only 1/local_size of the
      buffer across nodes;
    - otherwise native: on one node MPI's own allreduce (shared memory, tuned algorithms) is the fastest.
    """
    if not native_exact and nbytes >= HALF_RING_MIN_BYTES:
        return "ring"
    if cross_size > 1 and local_size > 1 and nbytes >= HIERARCHICAL_MIN_BYTES:
        return "hierarchical"
    return "native"


def chunk_bytes(default: int) -> int:
    """Ring pipelining chunk size: $HPCRING_RING_CHUNK_BYTES or `default` (a tuning knob for benchmarks)."""
    raw = os.environ.get(CHUNK_ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{CHUNK_ENV}={raw!r} is invalid; allowed: a positive number of bytes")
    return value
