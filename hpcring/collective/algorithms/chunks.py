"""Index arithmetic shared by the algorithms, kept pure so unit tests can check it without MPI.

One balancing rule everywhere: splitting `count` items into `n` parts gives the first `count % n` parts one
extra item. It is the reducescatter row rule of the public API, the ring's segment rule and the hierarchical
shard rule, so a rank's part is the same wherever it is computed.
"""

from __future__ import annotations


def part_sizes(count: int, n: int) -> list[int]:
    """Sizes of `n` balanced parts of `count` (parts `< count % n` get one extra)."""
    if n <= 0:
        raise ValueError(f"cannot split into {n} parts")
    base, extra = divmod(count, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def offsets(sizes: list[int]) -> list[int]:
    """Prefix sums: part i spans [offsets[i], offsets[i + 1])."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def bounds(count: int, n: int) -> list[int]:
    """Offsets of `n` balanced parts of `count`: part i spans [b[i], b[i + 1])."""
    return offsets(part_sizes(count, n))


def ring_reduce_segment(rank: int, size: int, step: int) -> tuple[int, int]:
    """(segment sent, segment received and reduced) by `rank` at reduce-scatter step `step` (0 .. size-2).

    Chosen so that after the last step rank r holds the full reduction of segment r, which is what a
    reduce-scatter must leave where the public rule says (rank r owns part r).
    """
    return (rank - step - 1) % size, (rank - step - 2) % size


def ring_gather_segment(rank: int, size: int, step: int) -> tuple[int, int]:
    """(segment sent, segment received) by `rank` at allgather step `step` (0 .. size-2); rank r starts
    holding segment r, where the reduce-scatter left it."""
    return (rank - step) % size, (rank - step - 1) % size


def chunk_ranges(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """Split [start, stop) into pipelining chunks of at most `chunk` items.

    An empty span still yields one empty range: both neighbours then post one zero-length message, which
    keeps the k-th send matched to the k-th receive without special cases."""
    if stop <= start:
        return [(start, start)]
    step = max(1, chunk)
    return [(a, min(a + step, stop)) for a in range(start, stop, step)]


def shard_owner(shard: int, shards: int, local_size: int) -> int:
    """Local rank that owns global shard `shard` on a node with `local_size` ranks, when every node splits the
    buffer into the same `shards` (= the largest node's rank count). Owners hold contiguous runs of shards,
    and each node has exactly one owner per shard, so shard j's cross-node group is one rank per node."""
    return shard * local_size // shards


def owned_shards(local_rank: int, shards: int, local_size: int) -> range:
    """The contiguous run of shards `local_rank` owns (the inverse of `shard_owner`)."""
    first = -(-local_rank * shards // local_size)
    last = -(-(local_rank + 1) * shards // local_size)
    return range(first, last)
