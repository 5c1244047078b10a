"""The Adasum algorithm's rules that need no second rank: sizes, tensor overlaps, coefficients, settings."""

from __future__ import annotations

import numpy as np
import pytest

from hpcring.collective import kernels
from hpcring.collective.algorithms import adasum
from hpcring.errors import ConfigError


def test_power_of_two_sizes() -> None:
    assert [n for n in range(1, 20) if adasum.is_power_of_two(n)] == [1, 2, 4, 8, 16]
    assert not adasum.is_power_of_two(0)
    assert adasum.allowed_sizes(3) == "1, 2, 4, 8, ..."
    assert adasum.allowed_sizes(20) == "1, 2, 4, 8, 16, ..."


def test_overlaps_count_each_tensor_inside_a_region() -> None:
    bounds = np.array([0, 5, 22, 23, 87])  # tensors of 5, 17, 1 and 64 elements
    assert adasum._overlaps(bounds, 0, 43).tolist() == [5, 17, 1, 20]
    assert adasum._overlaps(bounds, 43, 87).tolist() == [0, 0, 0, 44]
    assert adasum._overlaps(bounds, 3, 22).tolist() == [2, 17, 0, 0]


def test_coefficients_follow_horovods_guard() -> None:
    dot = np.array([2.0, 2.0, 0.0])
    norm_sq = np.array([4.0, 1e-160, 0.0])  # below sqrt(DBL_MIN): the coefficient stays 1
    assert adasum._coefficient(dot, norm_sq).tolist() == [0.75, 1.0, 1.0]


def test_dtypes_outside_horovods_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"allowed: 'float16', 'float32' or 'float64'"):
        adasum.check_dtype("bfloat16", "allreduce")


def test_chunk_size_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCRING_ADASUM_MPI_CHUNK_SIZE", raising=False)
    monkeypatch.delenv("HOROVOD_ADASUM_MPI_CHUNK_SIZE", raising=False)
    assert kernels.adasum_chunk_bytes() == 1 << 30
    monkeypatch.setenv("HOROVOD_ADASUM_MPI_CHUNK_SIZE", "4096")
    assert kernels.adasum_chunk_bytes() == 4096
    monkeypatch.setenv("HPCRING_ADASUM_MPI_CHUNK_SIZE", "512")  # hpcring's name wins
    assert kernels.adasum_chunk_bytes() == 512
    monkeypatch.setenv("HPCRING_ADASUM_MPI_CHUNK_SIZE", "zero")
    with pytest.raises(ConfigError, match="HPCRING_ADASUM_MPI_CHUNK_SIZE='zero' is invalid"):
        kernels.adasum_chunk_bytes()
