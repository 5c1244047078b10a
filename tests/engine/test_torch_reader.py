"""The torch reader (src/torch_reader.cpp): what the compiled submit reads of a tensor through torch's C++ API
must be what torch's Python attributes say, and it must decline everything the core leaves to Python.

The project's own set-up builds it (make setup: a build without isolation sees the installed torch), so here
it must load; elsewhere the compiled submit reads the same through torch's Python attributes.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from hpcring.engine import core

pytestmark = pytest.mark.skipif(core.kind() != "compiled", reason="the torch reader serves the compiled core")


def _reader() -> Any:
    from hpcring.engine.core import _torch_reader

    return _torch_reader


def test_the_reader_is_built_and_in_use_here() -> None:
    """make setup builds it against this torch: a broken build must not leave CI on torch's getters."""
    if core.reader_turned_off():
        pytest.skip("HPCRING_TORCH_READER=0")
    in_use, line = core.reader_status()
    assert in_use, line
    assert torch.__version__ == _reader().TORCH_VERSION


PLAIN = [torch.float32, torch.float64, torch.float16, torch.int8, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("dtype", [*PLAIN, torch.bool, torch.bfloat16, torch.int16])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 1, 4), (), (1,) * 9])
def test_a_plain_tensor_reads_as_torch_says(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = torch.ones(shape, dtype=dtype)
    got = _reader().read(t)
    assert got == (t.data_ptr(), tuple(t.shape), _reader().scalar_type_of(dtype))


def test_a_view_with_an_offset_reads_its_own_address() -> None:
    base = torch.arange(20.0)
    view = base[5:15].view(2, 5)
    got = _reader().read(view)
    assert got is not None and got[0] == view.data_ptr() == base.data_ptr() + 5 * 4 and got[1] == (2, 5)


class _Sub(torch.Tensor):
    pass


DECLINED = ["transposed", "strided", "requires_grad", "parameter", "empty", "sparse", "meta", "subclass"]


@pytest.mark.parametrize("case", [*DECLINED, "neg", "conj"])
def test_what_the_core_leaves_to_python_is_declined(case: str) -> None:
    make = {
        "transposed": lambda: torch.ones(4, 6).t(),
        "strided": lambda: torch.ones(10)[::2],
        "requires_grad": lambda: torch.ones(3, requires_grad=True),
        "parameter": lambda: torch.nn.Parameter(torch.ones(3)),
        "empty": lambda: torch.empty(0, 3),
        "sparse": lambda: torch.ones(2, 2).to_sparse(),
        "meta": lambda: torch.ones(3, device="meta"),
        "subclass": lambda: torch.ones(3).as_subclass(_Sub),
        "neg": lambda: torch._neg_view(torch.ones(3)),
        "conj": lambda: torch.ones(3, dtype=torch.complex64).conj(),
    }
    assert _reader().read(make[case]()) is None


def test_a_tensor_without_storage_is_declined_not_raised() -> None:
    """A functorch wrapper has no storage: torch raises on its data pointer, the reader declines."""
    from torch.func import vmap

    seen: list[Any] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(_reader().read(x))
        return x

    vmap(probe)(torch.ones(2, 3))
    assert seen == [None]


def test_scalar_type_of_refuses_what_is_not_a_dtype() -> None:
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        _reader().scalar_type_of("float32")
    numbers = {_reader().scalar_type_of(d) for d in PLAIN}
    assert len(numbers) == len(PLAIN)


def test_turned_off_the_submit_reads_through_torchs_attributes() -> None:
    """HPCRING_TORCH_READER=0 (the paired benchmarks): the submit still takes the common case, through
    torch's Python attributes, and hpcring doctor says so without calling it missing."""
    code = (
        "from hpcring.engine import core; from hpcring.torch import one_call; import torch;"
        "print(core.reader_status());"
        "t = torch.ones(3); print(one_call.SUBMITTER is not None)"
    )
    env = {"HPCRING_TORCH_READER": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        '(False, "torch\'s Python attributes (HPCRING_TORCH_READER=0)")',
        "True",
    ]
