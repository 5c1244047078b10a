"""Typed interface of the torch reader (src/torch_reader.cpp), built only against an installed torch."""

from typing import Any

TORCH_VERSION: str
READ_TENSOR: Any  # a PyCapsule holding the C function the core's Submitter calls

def scalar_type_of(dtype: Any, /) -> int: ...
def read(tensor: Any, /) -> tuple[int, tuple[int, ...], int] | None: ...
