"""The lone request's cycle in the compiled core (hpcring/engine/lone_cycle.py, core/src/lone.c).

A synchronous small host allreduce whose name is cached runs its cycles in C; every other cycle is the
Python one, and an agreement C does not finish itself goes on in Python. These cases drive each of those
turns and check the results from rank and size, so the file passes on both paths (on the pure-Python one the
`lone` counter stays at 0); the results of the two paths are compared bit for bit within one launch.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType

import numpy as np
import pytest
import torch

from hpcring.torch import basics


def _lone() -> int:
    return int(basics.engine().stats["lone"])


def _compiled() -> bool:
    """The compiled core runs plain cycles here: it is built, no timeline records and this rank is in one
    process set only (a launch of this suite records a timeline on rank 0, and an earlier file of it leaves
    a process set registered: their cycles are all Python's)."""
    from hpcring.engine import core

    state = basics.engine()._state
    return core.kind() == "compiled" and state.timeline is None and len(state.sets) == 1


def test_a_repeated_small_allreduce_runs_its_cycles_in_the_core(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    before = _lone()
    for step in range(20):
        x = torch.full((7,), float(r + step))
        assert hvd.allreduce_(x, name="lone.repeat", op=hvd.Sum) is x
        assert x.tolist() == [float(n * step + n * (n - 1) // 2)] * 7
        y = hvd.allreduce(torch.full((3,), float(r)), name="lone.avg")
        assert y.tolist() == [(n - 1) / 2] * 3
    ran = _lone() - before
    if _compiled():
        assert ran > 0  # the first call of each name goes through the table; the others need not
    else:
        assert ran == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_core_scales_exactly_as_the_python_path(hvd: ModuleType, dtype: torch.dtype) -> None:
    """The first call of a name runs the Python cycle (through the table), the second the plain one: with
    the same inputs the results are equal bit for bit (AVERAGE's 1/size and a postscale in one factor)."""
    r = hvd.rank()
    gen = torch.Generator().manual_seed(1234 + r)
    data = torch.rand(33, generator=gen, dtype=torch.float64).to(dtype) * 10
    name = f"lone.scale.{dtype}"
    first = hvd.allreduce(data.clone(), name=name, op=hvd.Average, postscale_factor=0.3)
    second = hvd.allreduce(data.clone(), name=name, op=hvd.Average, postscale_factor=0.3)
    assert np.array_equal(first.numpy(), second.numpy())
    inplace = data.clone()
    hvd.allreduce_(inplace, name=name + ".ip", op=hvd.Average, postscale_factor=0.3)
    hvd.allreduce_(again := data.clone(), name=name + ".ip", op=hvd.Average, postscale_factor=0.3)
    assert np.array_equal(inplace.numpy(), again.numpy())
    assert np.array_equal(inplace.numpy(), first.numpy())


@pytest.mark.parametrize(
    ("dtype", "op", "expect"),
    [
        (torch.int32, "Min", lambda n: 1),
        (torch.int64, "Max", lambda n: n),
        (torch.int32, "Product", lambda n: int(np.prod(np.arange(1, n + 1)))),
        (torch.int64, "Average", lambda n: (n * (n + 1) // 2) // n),  # trunc(sum / n) of positive ints
        (torch.uint8, "Sum", lambda n: n * (n + 1) // 2),
    ],
)
def test_integer_ops_through_the_core(hvd: ModuleType, dtype: torch.dtype, op: str, expect: object) -> None:
    n, r = hvd.size(), hvd.rank()
    for _ in range(3):  # the first through the table, the others plain (Average of ints: in Python)
        x = torch.full((5,), r + 1, dtype=dtype)
        hvd.allreduce_(x, name=f"lone.int.{dtype}.{op}", op=getattr(hvd, op))
        assert x.tolist() == [expect(n)] * 5  # type: ignore[operator]


def test_synchronize_runs_a_lone_async_ops_cycle_on_the_waiting_thread(hvd: ModuleType) -> None:
    """`synchronize` of a lone async op runs its cycle on the waiting thread, as a synchronous op's wait
    does, instead of sleeping until the engine thread has taken the GIL and run it. The switch interval is
    long, so the engine thread runs Python only when this thread lets the GIL go: on one rank, where the
    plain cycle never does, every wait is inline; with peers, waits that find the engine thread holding the
    cycle lock block as before. In place and out of place, with the results from rank and size."""
    n, r = hvd.size(), hvd.rank()
    state = basics.engine()._state
    for name in ("lone.async.ip", "lone.async.oop"):  # cached: from now on each cycle is the plain one
        hvd.allreduce(torch.ones(5), name=name, op=hvd.Sum)
    time.sleep(0.05)  # the engine thread settles: any wake-up it was sent is spent
    before = int(state.stats["inline"])
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        for step in range(20):
            x = torch.full((5,), float(r + step))
            if step % 2:
                out = hvd.synchronize(hvd.allreduce_async_(x, name="lone.async.ip", op=hvd.Sum))
                assert out is x
            else:
                out = hvd.synchronize(hvd.allreduce_async(x, name="lone.async.oop", op=hvd.Sum))
                assert out is not x and x.tolist() == [float(r + step)] * 5
            assert out.tolist() == [float(n * step + n * (n - 1) // 2)] * 5
    finally:
        sys.setswitchinterval(old)
    inline = int(state.stats["inline"]) - before
    if state.timeline is not None:  # nothing runs inline while a timeline records
        assert inline == 0
    elif n == 1 and _compiled():
        assert inline == 20
    else:
        assert inline > 0


def test_a_late_peer_takes_the_agreement_back_to_python(hvd: ModuleType) -> None:
    """A rank whose peers have not submitted yet agrees on "not ready" and goes on in Python (`conclude`),
    then in the core again; the op completes with every rank's value."""
    n, r = hvd.size(), hvd.rank()
    hvd.allreduce(torch.ones(1), name="lone.late", op=hvd.Sum)  # cached on every rank
    for late in range(n):
        if r == late:
            time.sleep(0.05)
        x = torch.full((2,), float(r))
        hvd.allreduce_(x, name="lone.late", op=hvd.Sum)
        assert x.tolist() == [float(n * (n - 1) // 2)] * 2


def test_a_mismatch_under_a_cached_name_raises_on_every_rank(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    for _ in range(2):
        assert hvd.allreduce(torch.ones(4), name="lone.mismatch", op=hvd.Sum).tolist() == [float(n)] * 4
    if n == 1:
        return
    with pytest.raises(hvd.HorovodInternalError, match=r"lone\.mismatch.*shape"):
        hvd.allreduce(torch.ones(5 if r == 1 else 4), name="lone.mismatch", op=hvd.Sum)
    assert hvd.allreduce(torch.ones(4), name="lone.mismatch", op=hvd.Sum).tolist() == [float(n)] * 4


def test_what_the_core_does_not_take_runs_in_python(hvd: ModuleType) -> None:
    """A prescale, a half float and a request above MPI's own allreduce (64 KiB, past what a waiting thread
    runs) leave the counter alone and give the right results."""
    n, r = hvd.size(), hvd.rank()
    cases = [
        (torch.full((4,), float(r + 1)), {"prescale_factor": 2.0}, float(n * (n + 1))),
        (torch.full((4,), float(r + 1), dtype=torch.float16), {}, float(n * (n + 1) // 2)),
        (torch.full((20000,), float(r + 1)), {}, float(n * (n + 1) // 2)),
    ]
    for i, (x, kwargs, want) in enumerate(cases):
        hvd.allreduce_(x.clone(), name=f"lone.not.{i}", op=hvd.Sum, **kwargs)  # cache the name first
        before = _lone()
        hvd.allreduce_(x, name=f"lone.not.{i}", op=hvd.Sum, **kwargs)
        assert _lone() == before
        assert float(x[0]) == want and float(x[-1]) == want
