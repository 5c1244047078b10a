"""Gradient compression applied around the allreduce, as in `horovod.torch.compression`.

A compressor turns a tensor into what travels on the wire and back. `Compression.fp16` halves the bytes of
float32 gradients (Horovod's own); `Compression.bf16` does the same with bfloat16, which keeps float32's
exponent range, so large gradients do not overflow to inf the way they can in float16 (Horovod lacks it).
Non-floating tensors pass through unchanged, as in Horovod, because casting integers to a float format would
lose values.
"""

from __future__ import annotations

from typing import Any

from hpcring import _deps


class Compressor:
    """Interface: `compress(t)` gives `(wire_tensor, ctx)`; `decompress(wire_tensor, ctx)` undoes it.

    `wire_dtype` names the dtype a compressor that only casts floating tensors sends: DistributedOptimizer's
    buckets then cast into a persistent buffer of that dtype and back, instead of allocating two tensors per
    bucket per step (None: call compress/decompress)."""

    wire_dtype: str | None = None

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Return the tensor to send and whatever `decompress` needs to undo the transformation."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Undo `compress` on the reduced tensor, using the context `compress` returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are: the reduction happens in place on the gradient itself."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


def _cast_floating(tensor: Any, wire_dtype_name: str) -> tuple[Any, Any]:
    """Cast floating tensors to the named 16-bit type; the context is the original dtype."""
    dtype = getattr(_deps.torch(), wire_dtype_name)
    if tensor.dtype.is_floating_point and tensor.dtype != dtype:
        return tensor.to(dtype), tensor.dtype
    return tensor, tensor.dtype


def _restore(tensor: Any, ctx: Any) -> Any:
    """Cast back to the dtype recorded by `_cast_floating` (no copy when it already matches)."""
    if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
        return tensor.to(ctx)
    return tensor


class FP16Compressor(Compressor):
    """Casts floating tensors to float16 on the wire (half the bytes of float32; range up to 65504)."""

    wire_dtype = "float16"

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return _cast_floating(tensor, "float16")

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return _restore(tensor, ctx)


class BF16Compressor(Compressor):
    """Casts floating tensors to bfloat16 on the wire (half the bytes, float32's range, 8-bit mantissa)."""

    wire_dtype = "bfloat16"

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return _cast_floating(tensor, "bfloat16")

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return _restore(tensor, ctx)


class Compression:
    """The compressors by name, as in `hvd.Compression.fp16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
