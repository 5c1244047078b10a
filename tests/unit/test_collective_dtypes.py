"""dtype table, op checks, wire views and the scaling/averaging rules (one rounding, integer truncation)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hpcring.collective import dtypes
from hpcring.collective.ops import ReduceOp, parse_op, ufunc
from hpcring.errors import ConfigError

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_supported_names_and_refusal_lists_them() -> None:
    assert dtypes.check_dtype(np.dtype(np.float32), "x") == "float32"
    assert dtypes.check_dtype(BF16, "x") == "bfloat16"
    assert dtypes.check_dtype(np.dtype(bool), "x") == "bool"
    with pytest.raises(ConfigError, match="unsupported dtype 'complex128'; supported: 'uint8', 'int8'"):
        dtypes.check_dtype(np.dtype(np.complex128), "allreduce")
    with pytest.raises(ConfigError, match="'uint16'"):
        dtypes.check_dtype(np.dtype(np.uint16), "allreduce")


def test_bool_allows_only_min_and_max() -> None:
    dtypes.check_op("bool", ReduceOp.MIN, "x")
    dtypes.check_op("bool", ReduceOp.MAX, "x")
    for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT):
        with pytest.raises(ConfigError, match="MIN \\(logical and\\) or MAX \\(logical or\\)"):
            dtypes.check_op("bool", op, "x")
    dtypes.check_op("int8", ReduceOp.PRODUCT, "x")


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float16, np.float32, np.int64, bool])
def test_wire_view_shares_memory_with_same_width(dtype: type) -> None:
    a = np.zeros((3, 4), dtype=dtype)
    w = dtypes.wire_view(a)
    assert w.dtype.itemsize == a.dtype.itemsize and w.dtype.kind == "u"
    assert np.shares_memory(a, w) and w.shape == (12,)


def test_wire_view_of_bfloat16() -> None:
    a = np.array([1.5, -2.0], dtype=BF16)
    w = dtypes.wire_view(a)
    assert w.dtype == np.uint16
    np.testing.assert_array_equal(w.view(BF16), a)


def test_accumulator_widens_only_16_bit_floats() -> None:
    assert dtypes.accumulator(np.dtype(np.float16)) == np.float32
    assert dtypes.accumulator(BF16) == np.float32
    assert dtypes.accumulator(np.dtype(np.int16)) == np.int16


def test_scale_float16_rounds_once() -> None:
    # 0.1 in float16 is 0.0999755859375; x * f16(1/3) would round the factor first.
    x = np.array([3.0, 0.3, 1000.0], dtype=np.float16)
    want = (x.astype(np.float64) / 3).astype(np.float16)
    dtypes.scale(x, 1 / 3)
    np.testing.assert_array_equal(x, want)


def test_scale_integers_truncates_toward_zero() -> None:
    x = np.array([7, -7, 5], dtype=np.int32)
    dtypes.scale(x, 0.5)
    np.testing.assert_array_equal(x, [3, -3, 2])
    with pytest.raises(ConfigError, match="numeric dtypes only"):
        dtypes.scale(np.ones(2, dtype=bool), 2.0)


def test_integer_average_is_exact_truncated_division() -> None:
    # k * n for many k: multiplying by a rounded 1/n could land just below k; dividing never does.
    n = 3
    sums = np.arange(-3000, 3000, dtype=np.int64) * n + np.array([0, 1, 2] * 2000)
    got = sums.copy()
    dtypes.average(got, n)
    np.testing.assert_array_equal(got, np.trunc(sums / n).astype(np.int64))
    f = np.array([6.0, 1.0], dtype=np.float32)
    dtypes.average(f, 4, postscale=2.0)
    np.testing.assert_allclose(f, [3.0, 0.5])


def test_parse_op_names_aliases_and_error() -> None:
    assert parse_op("sum") is ReduceOp.SUM
    assert parse_op("Average") is ReduceOp.AVERAGE
    assert parse_op("avg") is ReduceOp.AVERAGE
    assert parse_op("PRODUCT") is ReduceOp.PRODUCT
    assert parse_op(ReduceOp.MIN) is ReduceOp.MIN
    with pytest.raises(ConfigError, match="allowed: 'SUM', 'AVERAGE', 'MIN', 'MAX' or 'PRODUCT'"):
        parse_op("median")
    with pytest.raises(ConfigError):
        parse_op(3)


def test_ufuncs_reduce_in_place() -> None:
    a, b = np.array([1, 5], dtype=np.int8), np.array([4, 2], dtype=np.int8)
    ufunc(ReduceOp.MAX, a.dtype)(a, b, out=a)
    np.testing.assert_array_equal(a, [4, 5])
    assert ufunc(ReduceOp.AVERAGE, a.dtype) is np.add
    x, y = np.array([True, False]), np.array([True, True])
    np.testing.assert_array_equal(ufunc(ReduceOp.MIN, x.dtype)(x, y), [True, False])
    h = np.array([1.5], dtype=BF16)
    ufunc(ReduceOp.SUM, h.dtype)(h, h, out=h)
    assert float(h[0]) == 3.0
