"""Which allreduce algorithm runs: the per-call choice, the environment default, and the `auto` rule.

The `auto` rule is a pure function of the message size, whether MPI can reduce the dtype itself, and the node
layout, so it is unit-tested without MPI and documented (with the measurements behind its thresholds) in
docs/guide/collectives.md. Every rank computes the same choice from the same agreed inputs.
"""

from __future__ import annotations

import os

from hpcring.config import ALGORITHMS as ALGORITHMS  # re-exported: the names `algorithm=` takes
from hpcring.errors import ConfigError, choices

ALGORITHM_ENV = "HPCRING_ALLREDUCE_ALGORITHM"
CHUNK_ENV = "HPCRING_RING_CHUNK_BYTES"
SEGMENT_ENV = "HPCRING_HIER_SEGMENT_BYTES"

# Thresholds of the auto rule (see docs/guide/collectives.md, "How auto chooses").
RING_MIN_BYTES = 1 << 20  # from here on our pipelined ring beats MPI's allreduce on one node
HALF_RING_MIN_BYTES = 64 << 10  # float16/bfloat16 from here on: our ring (native widens to float32)
SHM_MIN_BYTES = 1 << 20  # one node with SHM_MIN_RANKS ranks or more, at least this big: shared memory
SHM_MIN_RANKS = 4  # with 2 ranks the ring (single-copy transfers) measured faster for contiguous buffers
HIERARCHICAL_MIN_BYTES = 1 << 20  # several nodes with several ranks each, at least this big: hierarchical
# reducescatter: MPI_Reduce_scatter below this size (fewer latency steps), our ring from it on (Open MPI's
# reduce-scatter measured several times slower than the ring at 64 MiB).
NATIVE_REDUCE_SCATTER_MAX_BYTES = 64 << 10


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


def choose_algorithm(
    nbytes: int, *, native_exact: bool, local_size: int, cross_size: int, shm_min_ranks: int = SHM_MIN_RANKS
) -> str:
    """The `auto` rule.

    - small messages: native. MPI's latency-optimised algorithms need log(n) steps, our ring 2(n-1), each
      with Python overhead; for float16/bfloat16 (MPI cannot add them, `native_exact` False) native widens to
      float32, which is cheap while the message is small;
    - several nodes, each with several ranks, from HIERARCHICAL_MIN_BYTES: hierarchical, so only
      1/local_size of the buffer crosses the network per rank;
    - every rank on one node, at least `shm_min_ranks` of them (SHM_MIN_RANKS by default), from
      SHM_MIN_BYTES (HALF_RING_MIN_BYTES for 16-bit floats): shm, one copy in and one out through a
      shared-memory segment, which measured faster than the ring (2(n-1) dependent steps) and both MPIs'
      allreduce there; with 2 ranks the ring measured faster alone (the caller falls back to the ring where
      the ranks cannot share memory). The engine passes a lower minimum: its collectives run beside a
      training thread, which shm's yielding barriers leave the CPU to and the ring's busy-polled waits do not;
    - otherwise from RING_MIN_BYTES (HALF_RING_MIN_BYTES for 16-bit floats): our pipelined ring, which moves
      the minimum 2(n-1)/n of the buffer, reduces 16-bit floats in their own dtype and measured faster than
      both MPIs' allreduce for large messages.
    """
    if cross_size > 1 and local_size > 1 and nbytes >= HIERARCHICAL_MIN_BYTES:
        return "hierarchical"
    one_node = cross_size == 1 and local_size >= shm_min_ranks
    if one_node and nbytes >= (SHM_MIN_BYTES if native_exact else HALF_RING_MIN_BYTES):
        return "shm"
    if nbytes >= (RING_MIN_BYTES if native_exact else HALF_RING_MIN_BYTES):
        return "ring"
    return "native"


def env_bytes(name: str, default: int, minimum: int, allowed: str) -> int:
    """A byte count from $`name`, `default` when unset; a ConfigError naming the variable, its value and
    `allowed` when it is not an integer of at least `minimum`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} is invalid; allowed: {allowed}")
    return value


def chunk_bytes(default: int) -> int:
    """Ring pipelining chunk size: $HPCRING_RING_CHUNK_BYTES or `default` (a tuning knob for benchmarks)."""
    return env_bytes(CHUNK_ENV, default, 1, "a positive number of bytes")


def segment_bytes(default: int) -> int:
    """Hierarchical pipeline segment size: $HPCRING_HIER_SEGMENT_BYTES or `default` (a tuning knob); 0 turns
    the pipeline off (the three stages then run one after another on the whole buffer)."""
    return env_bytes(SEGMENT_ENV, default, 0, "a positive number of bytes, or 0 for no pipelining")
