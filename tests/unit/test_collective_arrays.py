"""Zero-copy views of numpy arrays and CPU torch tensors, and hand-back in the caller's kind."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcring.collective.arrays import as_buffer, is_tensor, to_kind
from hpcring.collective.topology import emulated_nodes, normalize_nodes
from hpcring.errors import ConfigError


def test_numpy_contiguous_is_not_copied() -> None:
    a = np.arange(6.0).reshape(2, 3)
    buf = as_buffer(a, "x")
    assert buf.array is a and not buf.copied and not buf.is_torch


def test_numpy_strided_is_copied_and_written_back() -> None:
    base = np.zeros((3, 3))
    buf = as_buffer(base[:, 1], "x")
    assert buf.copied and buf.array.flags.c_contiguous
    buf.array[...] = 7
    buf.writeback()
    assert (base[:, 1] == 7).all() and (base[:, 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.bool])
def test_tensor_view_shares_memory(dtype: torch.dtype) -> None:
    t = torch.zeros(4, dtype=dtype)
    buf = as_buffer(t, "x")
    assert buf.is_torch and not buf.copied
    buf.array[1] = 1
    assert t[1].item() == 1
    back = to_kind(buf.array, torch_like=True)
    assert isinstance(back, torch.Tensor) and back.dtype == dtype
    assert back.data_ptr() == t.data_ptr()


def test_tensor_requiring_grad_and_non_contiguous() -> None:
    w = torch.zeros(2, 3, requires_grad=True)
    assert as_buffer(w, "x").array.shape == (2, 3)
    t = torch.zeros(3, 3)
    buf = as_buffer(t[:, 0], "x")
    assert buf.copied
    buf.array[...] = 5
    buf.writeback()
    assert (t[:, 0] == 5).all() and (t[:, 1] == 0).all()


def test_other_kinds_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"expected a numpy\.ndarray or a CPU torch\.Tensor, got builtins\.list"
    ):
        as_buffer([1, 2], "allreduce")
    assert not is_tensor(np.zeros(1)) and is_tensor(torch.zeros(1))


def test_emulated_nodes_are_contiguous_blocks() -> None:
    assert emulated_nodes(4, {"HPCRING_EMULATE_NODES": "2"}) == [0, 0, 1, 1]
    assert emulated_nodes(3, {"HPCRING_EMULATE_NODES": "2"}) == [0, 0, 1]
    assert emulated_nodes(5, {"HPCRING_EMULATE_NODES": "3"}) == [0, 0, 1, 1, 2]
    assert emulated_nodes(4, {}) is None
    for bad in ("0", "5", "two"):
        with pytest.raises(ConfigError, match="allowed: an integer from 1 to 4"):
            emulated_nodes(4, {"HPCRING_EMULATE_NODES": bad})


def test_normalize_nodes_orders_by_lowest_rank() -> None:
    assert normalize_nodes([7, 7, 3, 3, 9]) == [0, 0, 1, 1, 2]
