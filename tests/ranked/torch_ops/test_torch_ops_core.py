"""The compiled core's one-call submit (hpcring/torch/one_call.py) against the Python path it stands for.

The common case (a dense contiguous CPU tensor of a plain dtype, a name, a plain reduce op, float factors, a
registered set) goes through the core when it is built; everything else falls through to the Python path
before anything was queued. Each case checks the result from rank and size, so the same file passes on both
paths (CI runs the ranked suites with HPCRING_PURE_PYTHON=1 too).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import pytest
import torch


def _submitter() -> Any:
    from hpcring.torch import one_call

    return one_call.SUBMITTER


def test_the_core_in_use_is_the_one_the_environment_asks_for(hvd: ModuleType) -> None:
    from hpcring.engine import core

    if os.environ.get("HPCRING_PURE_PYTHON", "") not in ("", "0"):
        assert core.kind() == "python" and core.forced()
    assert (_submitter() is None) == (core.kind() == "python")


def test_the_common_case_is_taken_in_one_call(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    t = torch.full((64,), float(r + 1))
    sub = _submitter()
    if sub is None:
        pytest.skip("the pure-Python path has no one-call submit")
    handle = sub.allreduce(t, t, "core.common", hvd.Sum, None, 1.0, 1.0, hvd.global_process_set)
    assert type(handle) is int
    assert hvd.synchronize(handle) is t
    assert t.tolist() == [float(n * (n + 1) // 2)] * 64


DTYPES = [torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_dtypes_in_place_and_out_of_place(hvd: ModuleType, dtype: torch.dtype) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((3, 5), r + 1, dtype=dtype)
    y = hvd.synchronize(hvd.allreduce_async(x, name=f"core.oop.{dtype}", op=hvd.Sum))
    assert y.dtype == dtype and y.shape == (3, 5) and y is not x
    assert x.tolist() == [[r + 1] * 5] * 3  # the input is untouched
    assert y.tolist() == [[n * (n + 1) // 2] * 5] * 3
    z = hvd.synchronize(hvd.allreduce_async_(x, name=f"core.ip.{dtype}", op=hvd.Max))
    assert z is x and x.tolist() == [[n] * 5] * 3


@pytest.mark.parametrize(
    "case",
    [
        "noncontiguous",
        "requires_grad",
        "scalar",
        "empty",
        "noname",
        "bool",
        "bfloat16",
        "complex",
        "int_scale",
    ],
)
def test_what_the_core_leaves_to_python_still_works(hvd: ModuleType, case: str) -> None:
    n, r = hvd.size(), hvd.rank()
    total = n * (n + 1) / 2
    name: str | None = f"core.other.{case}"
    pre: Any = 1.0
    if case == "noncontiguous":
        x = torch.full((4, 6), float(r + 1)).t()
    elif case == "requires_grad":
        x = torch.full((4,), float(r + 1), requires_grad=True)
    elif case == "scalar":
        x = torch.tensor(float(r + 1))
    elif case == "empty":
        x = torch.empty(0, 3)
    elif case == "noname":
        x, name = torch.full((4,), float(r + 1)), None
    elif case == "bool":
        x = torch.tensor([r == 0, True])
    elif case == "bfloat16":
        x = torch.full((4,), float(r + 1), dtype=torch.bfloat16)
    elif case == "complex":
        x = torch.full((4,), complex(r + 1, 1))
    else:
        x, pre = torch.full((4,), float(r + 1)), 2
    sub = _submitter()
    if sub is not None and case not in ("noname", "int_scale", "scalar"):  # a 0-d tensor is common
        assert sub.allreduce(x, x, name, hvd.Sum, None, 1.0, 1.0, hvd.global_process_set) is NotImplemented
    op = hvd.Max if case == "bool" else hvd.Sum
    if case == "complex":  # not a dtype hpcring reduces: the same error as before the core, on every rank
        with pytest.raises(ValueError, match="ComplexFloatTensor is not supported"):
            hvd.allreduce_async(x, name=name, op=op)
        return
    y = hvd.synchronize(hvd.allreduce_async(x, name=name, op=op, prescale_factor=pre))
    if case == "bool":
        assert y.tolist() == [True, True]
    elif case == "empty":
        assert y.shape == (0, 3)
    else:
        expected = total * (2 if case == "int_scale" else 1)
        assert torch.equal(y.float(), torch.full(x.shape, expected)), y


def test_a_duplicate_name_in_flight_is_refused_the_same_way(hvd: ModuleType) -> None:
    a, b = torch.ones(8), torch.ones(8)
    first = hvd.allreduce_async_(a, name="core.dup", op=hvd.Sum)
    with pytest.raises(ValueError, match=r"core\.dup"):
        hvd.allreduce_async_(b, name="core.dup", op=hvd.Sum)
    assert hvd.synchronize(first).tolist() == [float(hvd.size())] * 8


def test_average_keywords_and_scale_factors(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((5,), float(r + 1))
    y = hvd.synchronize(hvd.allreduce_async(x, name="core.avg"))  # Average by default
    assert torch.allclose(y, torch.full((5,), (n + 1) / 2))
    y = hvd.synchronize(hvd.allreduce_async(x, average=False, name="core.avgkw"))  # Horovod's old keyword
    assert torch.allclose(y, torch.full((5,), n * (n + 1) / 2))
    y = hvd.synchronize(
        hvd.allreduce_async(x, name="core.scaled", op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    )
    assert torch.allclose(y, torch.full((5,), 2.0 * n * (n + 1) / 2))


def test_many_at_once_then_synchronized_in_reverse(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    tensors = [torch.full((257,), float(i + r)) for i in range(300)]
    handles = [hvd.allreduce_async_(t, name=f"core.many.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
    assert all(hvd.poll(h) in (True, False) for h in handles)
    for i, h in reversed(list(enumerate(handles))):
        assert hvd.synchronize(h) is tensors[i]
        assert tensors[i][0].item() == n * i + n * (n - 1) / 2
    assert hvd.synchronize(handles[0]) is None  # a handle already synchronized: None, as Horovod


def test_a_process_set_is_taken_by_the_core_too(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    evens = hvd.add_process_set(list(range(0, n, 2)))
    try:
        if r % 2 == 0:
            x = torch.full((6,), float(r))
            y = hvd.synchronize(hvd.allreduce_async_(x, name="core.set", op=hvd.Sum, process_set=evens))
            assert y.tolist() == [float(sum(range(0, n, 2)))] * 6
    finally:
        hvd.remove_process_set(evens)


def test_a_name_used_again_with_other_fields_gets_them(hvd: ModuleType) -> None:
    """The core reuses the signature it last built for a name only when every field agrees: the same name
    with another shape, dtype, op or factor reduces with what this call says."""
    n, r = hvd.size(), hvd.rank()
    total = n * (n + 1) // 2
    calls: list[tuple[torch.Tensor, Any, float, Any]] = [
        (torch.full((4,), float(r + 1)), hvd.Sum, 1.0, float(total)),
        (torch.full((4,), float(r + 1)), hvd.Sum, 1.0, float(total)),  # the reused signature
        (torch.full((2, 3), float(r + 1)), hvd.Sum, 1.0, float(total)),  # another shape
        (torch.full((6,), float(r + 1)), hvd.Sum, 1.0, float(total)),  # as many elements, another shape
        (torch.full((6,), r + 1, dtype=torch.int32), hvd.Sum, 1.0, total),  # another dtype
        (torch.full((6,), float(r + 1)), hvd.Max, 1.0, float(n)),  # another op
        (torch.full((6,), float(r + 1)), hvd.Max, 0.5, n / 2),  # another postscale
        (torch.full((6,), float(r + 1)), hvd.Max, 1.0, float(n)),  # back again
    ]
    for x, op, post, want in calls:
        y = hvd.synchronize(hvd.allreduce_async_(x, name="core.again", op=op, postscale_factor=post))
        assert y is x and y.tolist() == torch.full(x.shape, want, dtype=x.dtype).tolist()


def test_a_grouped_call_reads_the_batch_only_while_one_is_open(hvd: ModuleType) -> None:
    """Members of a grouped call join its batch, and once it ends, or fails, single calls are queued by the
    core again."""
    n, r = hvd.size(), hvd.rank()
    sub = _submitter()
    xs = [torch.full((3,), float(r + i)) for i in range(4)]
    out = hvd.synchronize(hvd.grouped_allreduce_async_(xs, name="core.group", op=hvd.Sum))
    assert [t.tolist() for t in out] == [[float(n * i + n * (n - 1) // 2)] * 3 for i in range(4)]
    with pytest.raises(ValueError):
        hvd.grouped_allreduce_async_([torch.ones(2), torch.ones(2, dtype=torch.complex64)], name="core.bad")
    if sub is None:
        return
    assert sub.groups_open == 0
    with pytest.raises(ValueError, match="more grouped calls ended than started"):
        sub.group(-1)
    x = torch.ones(3)
    handle = sub.allreduce(x, x, "core.after.group", hvd.Sum, None, 1.0, 1.0, hvd.global_process_set)
    assert type(handle) is int and hvd.synchronize(handle).tolist() == [float(n)] * 3


def test_in_flight_requests_stay_out_of_the_collector_and_nothing_is_left(hvd: ModuleType) -> None:
    """The one-call submit's handle, request and pending are not tracked while in flight (engine.md, "The
    compiled core"), and many steps of them leave no object behind on either path."""
    import gc

    from hpcring.torch import op_handles

    n = hvd.size()
    tensors = [torch.ones(32) for _ in range(16)]

    def step(k: int) -> None:
        for t in tensors:
            t.fill_(1.0)
        handles = [hvd.allreduce_async_(t, name=f"core.gc.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
        if k == 0 and _submitter() is not None:
            pending = op_handles._handle_map[handles[0]]
            assert not gc.is_tracked(pending) and not gc.is_tracked(pending.handles)
            assert not any(gc.is_tracked(h) for h in pending.handles)
        for h in handles:
            hvd.synchronize(h)

    def left_by_20_steps(first: int) -> int:
        gc.collect()
        before = len(gc.get_objects())
        for k in range(first, first + 20):
            step(k)
        gc.collect()
        return len(gc.get_objects()) - before

    step(0)
    # A leak of one object per request leaves 320 in every round; the frames other threads happen to be in
    # when the count is taken (a Condition's wait, a liveness read) only in some, so the best round counts.
    left = [left_by_20_steps(1 + 20 * r) for r in range(3)]
    assert min(left) < 50, f"objects left behind by 20 steps of 16 requests, in each of 3 rounds: {left}"
    assert all(t.tolist() == [float(n)] * 32 for t in tensors)


def test_both_ways_of_reading_a_tensor_take_and_decline_the_same(hvd: ModuleType) -> None:
    """The submit reads a tensor through the torch reader where it loads, and through torch's Python
    attributes otherwise (not built, HPCRING_TORCH_READER=0): both take the same tensors, in place and out of
    place, reduce them alike, and leave the same ones to the Python path."""
    from hpcring.torch import one_call

    n, r = hvd.size(), hvd.rank()
    getters = one_call.build_submitter(use_reader=False)
    if getters is None:
        pytest.skip("the pure-Python path has no one-call submit")
    ps = hvd.global_process_set
    for way, sub in (("reader", one_call.SUBMITTER), ("getters", getters)):
        cases: list[tuple[torch.dtype, tuple[int, ...]]] = [
            (torch.float32, (5,)),
            (torch.int64, (2, 3)),
            (torch.float16, ()),
        ]
        for i, (dtype, shape) in enumerate(cases):
            x = torch.full(shape, r + 1, dtype=dtype)
            out = torch.empty_like(x)
            handle = sub.allreduce(x, out, f"core.{way}.{i}", hvd.Sum, None, 1.0, 1.0, ps)
            assert type(handle) is int and hvd.synchronize(handle) is out
            assert out.tolist() == torch.full(shape, n * (n + 1) // 2, dtype=dtype).tolist()
            assert x.tolist() == torch.full(shape, r + 1, dtype=dtype).tolist()
        declined = [
            torch.ones(4, 6).t(),
            torch.ones(3, requires_grad=True),
            torch.empty(0),
            torch.ones(2, dtype=torch.bool),
            torch.ones(2, dtype=torch.bfloat16),
        ]
        for x in declined:
            assert sub.allreduce(x, x, f"core.{way}.no", hvd.Sum, None, 1.0, 1.0, ps) is NotImplemented
        x, wrong = torch.ones(4), torch.empty(5)  # an output of another shape: the Python path words it
        assert sub.allreduce(x, wrong, f"core.{way}.out", hvd.Sum, None, 1.0, 1.0, ps) is NotImplemented


def test_the_members_of_a_grouped_call_join_its_batch_through_the_core(hvd: ModuleType) -> None:
    """A grouped call's members go through the core's submit into the thread's batch, which the group queues
    at once: a member the core declines (a strided tensor) takes the Python path into the same batch, the
    others make no Python call; every member is in flight once the call returns, and the results come from
    rank and size, out of place and in place."""
    from hpcring.torch import basics

    n, r = hvd.size(), hvd.rank()
    core = _submitter() is not None
    engine = basics._engine
    plain = [torch.full((4,), float(r + i)) for i in range(3)]
    strided = torch.full((4, 2), float(r + 3)).t()  # not contiguous: the Python path's
    members = [*plain, strided]
    with engine._caller.lock:  # no cycle runs meanwhile: the group's requests stay queued
        handle, python = _python_calls(
            lambda: hvd.grouped_allreduce_async(members, name="core.batch", op=hvd.Sum), "_allreduce_async"
        )
        assert python == (1 if core else 4)
        inflight = engine._state.sets[0].inflight
        assert all(f"allreduce.core.batch.{i}" in inflight for i in range(4))
    out = hvd.synchronize(handle)
    base = n * (n - 1) // 2
    assert [t.tolist() for t in out[:3]] == [[float(base + n * i)] * 4 for i in range(3)]
    assert out[3].tolist() == [[float(base + n * 3)] * 4] * 2
    assert [t.tolist() for t in plain] == [[float(r + i)] * 4 for i in range(3)]  # the inputs untouched
    inplace = [torch.full((4,), float(r + i)) for i in range(3)]
    h, python = _python_calls(
        lambda: hvd.grouped_allreduce_async_(inplace, name="core.batch.ip", op=hvd.Sum), "_allreduce_async"
    )
    assert python == (0 if core else 3)
    back = hvd.synchronize(h)
    assert all(b is t for b, t in zip(back, inplace, strict=True))
    assert [t.tolist() for t in inplace] == [[float(base + n * i)] * 4 for i in range(3)]


def test_a_request_views_its_tensors_only_when_python_reads_them(hvd: ModuleType) -> None:
    """The one-call submit queues a request over the tensors' memory without numpy views; Python code that
    reads `tensor` or `output` (a cycle the core does not run itself) gets views of that memory, the output
    the same array as the input when in place, and the op still completes from them."""
    import numpy as np

    from hpcring.torch import basics

    n, r = hvd.size(), hvd.rank()
    sub = _submitter()
    if sub is None:
        pytest.skip("the pure-Python path has no one-call submit")
    engine = basics._engine
    ps = hvd.global_process_set
    x, y, out = torch.full((2, 3), float(r + 1)), torch.full((2, 3), float(r + 1)), torch.zeros(2, 3)
    with engine._caller.lock:  # no cycle runs meanwhile: the requests stay queued
        h_in = sub.allreduce(x, x, "core.lazy.in", hvd.Sum, None, 1.0, 1.0, ps)
        h_out = sub.allreduce(y, out, "core.lazy.out", hvd.Sum, None, 1.0, 1.0, ps)
        inflight = engine._state.sets[0].inflight
        req_in, req_out = inflight["allreduce.core.lazy.in"], inflight["allreduce.core.lazy.out"]
        view = req_in.tensor
        assert isinstance(view, np.ndarray) and view.shape == (2, 3) and view.dtype == np.float32
        assert view.ctypes.data == x.data_ptr() and view.base is x
        assert req_in.output is view  # in place: one array, as the Python path queues it
        assert req_out.output.ctypes.data == out.data_ptr() and req_out.tensor.ctypes.data == y.data_ptr()
    assert hvd.synchronize(h_in) is x
    assert hvd.synchronize(h_out) is out
    total = float(n * (n + 1) // 2)
    assert x.tolist() == out.tolist() == [[total] * 3] * 2
    assert y.tolist() == [[float(r + 1)] * 3] * 2


def test_allreduce_async_is_entered_in_c_and_reads_its_arguments_as_python_would(hvd: ModuleType) -> None:
    """`hvd.allreduce_async_` is the core's Entry over the Python function (one_call.entered_in_c): positional
    and keyword arguments reach the same op, what the core does not take goes to the Python function with
    the same arguments (which words every error), and it looks and pickles like the function it stands for."""
    import inspect
    import pickle

    from hpcring.torch import allreduce_ops

    n, r = hvd.size(), hvd.rank()
    f = hvd.allreduce_async_
    assert f is allreduce_ops.allreduce_async_
    if _submitter() is None:
        assert inspect.isfunction(f)  # the pure-Python path: the function itself
    else:
        assert not inspect.isfunction(f) and inspect.isfunction(f.__wrapped__)
    assert f.__name__ == "allreduce_async_" and f.__doc__ and f.__module__ == allreduce_ops.__name__
    params = ["tensor", "average", "name", "op", "prescale_factor", "postscale_factor", "process_set"]
    assert list(inspect.signature(f).parameters) == params
    assert pickle.loads(pickle.dumps(f)) is f
    ps = hvd.global_process_set
    calls = [
        lambda t: f(t, None, "entry.positional", hvd.Sum, 1.0, 1.0, ps),
        lambda t: f(t, name="entry.keywords", op=hvd.Sum),
        lambda t: f(tensor=t, op=hvd.Sum, name="entry.only.keywords", process_set=ps),
        lambda t: f(t, op=hvd.Sum),  # unnamed: numbered as the Python path numbers it
        lambda t: f(t, name="entry.int.factor", op=hvd.Sum, prescale_factor=2, postscale_factor=0.5),
    ]
    for call in calls:
        t = torch.full((4,), float(r + 1))
        assert hvd.synchronize(call(t)) is t
        assert t.tolist() == [float(n * (n + 1) // 2)] * 4
    x = torch.ones(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        f(x, bogus=1)
    with pytest.raises(TypeError, match="multiple values for argument 'tensor'"):
        f(x, tensor=x)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        f()
    with pytest.raises(TypeError, match="positional arguments"):
        f(x, None, "entry.too.many", hvd.Sum, 1.0, 1.0, ps, None)


def _python_calls(fn: Any, name: str) -> tuple[Any, int]:
    """fn()'s result and how many times a Python function called `name` ran meanwhile."""
    import sys

    count = 0

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_name == name:
            count += 1

    sys.setprofile(hook)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, count


def test_an_unnamed_allreduce_async_is_numbered_as_the_python_path_numbers_it(hvd: ModuleType) -> None:
    """An unnamed `allreduce_async_` draws `allreduce.noname.<n>` from the one counter of the Python path:
    taken in C (no Python call), left to Python before the draw (a strided tensor, an int factor), or left to
    it after the draw (the drawn name already in flight, named so by the caller), each call takes the next
    number, and the one whose number is taken fails as the Python path fails it. The same for the out-of-place
    `allreduce_async` and the synchronous `allreduce` over it."""
    from hpcring.torch import basics, op_handles

    n, r = hvd.size(), hvd.rank()
    f = hvd.allreduce_async_
    total = float(n * (n + 1) // 2)

    def number(handle: int) -> int:
        name = op_handles._handle_map[handle].handles[0].name
        assert name.startswith("allreduce.noname.")
        return int(name.rsplit(".", 1)[1])

    t = torch.full((4,), float(r + 1))
    h, python = _python_calls(lambda: f(t, op=hvd.Sum), "allreduce_async_")
    first = number(h)
    assert python == (0 if _submitter() is not None else 1)
    hvd.synchronize(h)
    wide = torch.full((4, 2), float(r + 1))
    calls = [
        lambda: f(torch.full((8,), float(r + 1)), op=hvd.Sum),  # the core
        lambda: f(wide[:, 0], op=hvd.Sum),  # strided: Python, before the draw
        lambda: f(torch.full((8,), float(r + 1)), op=hvd.Sum, prescale_factor=2),  # an int factor: Python
        lambda: f(torch.full((8,), float(r + 1)), None, None, hvd.Sum),  # positional: the core
    ]
    handles = [call() for call in calls]
    assert [number(h) for h in handles] == [first + 1, first + 2, first + 3, first + 4]
    results = [hvd.synchronize(h) for h in handles]
    assert [x.tolist()[0] for x in results] == [total, total, 2 * total, total]
    cycles = basics.engine()._caller.lock  # held: no cycle completes `held` before the refused call
    with cycles:
        held = f(torch.full((2,), float(r + 1)), name=f"noname.{first + 5}", op=hvd.Sum)
        with pytest.raises(ValueError, match=rf"'allreduce\.noname\.{first + 5}' is already in flight"):
            f(torch.ones(2), op=hvd.Sum)  # draws first + 5, the caller's name: refused as Python refuses it
    assert hvd.synchronize(held).tolist() == [total, total]
    last = f(torch.full((3,), float(r + 1)), op=hvd.Sum)
    assert number(last) == first + 6
    assert hvd.synchronize(last).tolist() == [total] * 3
    # out of place: allreduce_async draws the same way, and allreduce (synchronous) through it
    x = torch.full((3,), float(r + 1))
    out = hvd.allreduce_async(x, op=hvd.Sum)
    assert number(out) == first + 7
    assert hvd.synchronize(out).tolist() == [total] * 3 and x.tolist() == [float(r + 1)] * 3
    with cycles:
        held = hvd.allreduce_async(torch.full((2,), float(r + 1)), name=f"noname.{first + 8}", op=hvd.Sum)
        with pytest.raises(ValueError, match=rf"'allreduce\.noname\.{first + 8}' is already in flight"):
            hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
    assert hvd.synchronize(held).tolist() == [total, total]
    assert hvd.allreduce(x, op=hvd.Sum).tolist() == [total] * 3  # takes first + 9
    after = f(torch.full((1,), float(r + 1)), op=hvd.Sum)
    assert number(after) == first + 10
    assert hvd.synchronize(after).tolist() == [total]
