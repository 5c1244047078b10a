"""Runs on every rank inside the image (bind-mounted read-only by test_image_build.py), under `hpcring run`.

Each collective is checked against values computed from rank and size, so the same file is right for any -np.
A mismatch raises; the launcher then names the rank and the job fails. On success every rank prints one line.
"""

from __future__ import annotations

import os

import numpy as np

import hpcring


def offsets(sizes: list[int]) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]


def check_allreduce(r: int, n: int) -> None:
    x = np.arange(6, dtype=np.float64) + r
    base = np.arange(6, dtype=np.float64)
    for algorithm in ("native", "ring", "hierarchical"):
        got = hpcring.allreduce(x, op="sum", algorithm=algorithm)
        np.testing.assert_array_equal(got, n * base + n * (n - 1) / 2, err_msg=f"sum/{algorithm}")
    np.testing.assert_array_equal(hpcring.allreduce(x, op="average"), base + (n - 1) / 2)
    np.testing.assert_array_equal(hpcring.allreduce(x, op="max"), base + n - 1)
    ints = hpcring.allreduce(np.full(3, r + 1, dtype=np.int32), op="sum")
    assert ints.dtype == np.int32 and (ints == n * (n + 1) // 2).all(), ints


def check_allgather(r: int, n: int) -> None:
    """Uneven first dimensions: rank k contributes k + 1 rows filled with k."""
    got = hpcring.allgather(np.full((r + 1, 3), float(r)))
    expected = np.concatenate([np.full((k + 1, 3), float(k)) for k in range(n)])
    np.testing.assert_array_equal(got, expected)


def check_broadcast(r: int, n: int) -> None:
    root = 1 % n  # rank 1 when there is one, so a non-zero root is exercised
    got = hpcring.broadcast(np.full(5, 10.0 * r), root=root)
    np.testing.assert_array_equal(got, np.full(5, 10.0 * root))


def check_alltoall(r: int, n: int) -> None:
    """Rank r sends j + 1 rows of value 100 r + j to rank j, so it receives r + 1 rows from each rank k."""
    splits = [j + 1 for j in range(n)]
    x = np.concatenate([np.full((j + 1, 2), 100.0 * r + j) for j in range(n)])
    got, received = hpcring.alltoall(x, splits=splits)
    expected = np.concatenate([np.full((r + 1, 2), 100.0 * k + r) for k in range(n)])
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(received, np.full(n, r + 1))


def check_reducescatter(r: int, n: int) -> None:
    """2n + 1 rows (uneven parts): row i is i + r on rank r, so the sum is n i + n(n-1)/2."""
    rows = 2 * n + 1
    x = np.arange(rows, dtype=np.float64)[:, None].repeat(2, axis=1) + r
    parts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = offsets(parts)[r]
    expected = n * np.arange(start, start + parts[r], dtype=np.float64)[:, None].repeat(2, axis=1)
    np.testing.assert_array_equal(hpcring.reducescatter(x, op="sum"), expected + n * (n - 1) / 2)


def main() -> None:
    hpcring.init()
    r, n = hpcring.rank(), hpcring.size()
    check_allreduce(r, n)
    check_allgather(r, n)
    check_broadcast(r, n)
    check_alltoall(r, n)
    check_reducescatter(r, n)
    hpcring.barrier()
    print(f"rank {r}/{n} uid {os.getuid()}: collectives ok in the image", flush=True)
    hpcring.shutdown()


if __name__ == "__main__":
    main()
