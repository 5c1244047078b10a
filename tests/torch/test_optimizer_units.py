"""Single-process checks of what needs no other rank: compression round trips and the synchronous errors.

DistributedOptimizer validates its arguments before it talks to the engine, exactly as Horovod raises
ValueError at construction, so these run without `hvd.init()`; the same errors are checked on every rank of
a launched job in tests/ranked/torch_train.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("hpcring.torch")


@pytest.mark.parametrize(
    ("name", "wire", "rtol"), [("fp16", torch.float16, 1e-3), ("bf16", torch.bfloat16, 8e-3)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_16_bit_compression_round_trip(name: str, wire: torch.dtype, rtol: float, dtype: torch.dtype) -> None:
    compressor = getattr(hvd.Compression, name)
    t = torch.linspace(-100, 100, 1001, dtype=dtype)
    sent, ctx = compressor.compress(t)
    assert sent.dtype == wire and sent.numel() == t.numel()
    back = compressor.decompress(sent, ctx)
    assert back.dtype == dtype
    torch.testing.assert_close(back, t, rtol=rtol, atol=1e-6)  # atol: values near 0 underflow


def test_bf16_keeps_float32_range_where_fp16_overflows() -> None:
    big = torch.tensor([1e6, -3e38])
    fp16, ctx16 = hvd.Compression.fp16.compress(big)
    assert torch.isinf(hvd.Compression.fp16.decompress(fp16, ctx16)).all()
    bf16, ctx = hvd.Compression.bf16.compress(big)
    torch.testing.assert_close(hvd.Compression.bf16.decompress(bf16, ctx), big, rtol=8e-3, atol=0)


@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_integer_tensors_pass_through_unchanged(name: str) -> None:
    compressor = getattr(hvd.Compression, name)
    t = torch.arange(5)
    sent, ctx = compressor.compress(t)
    assert sent is t
    assert compressor.decompress(sent, ctx) is t


def test_none_compression_is_the_identity() -> None:
    t = torch.ones(3)
    sent, ctx = hvd.Compression.none.compress(t)
    assert sent is t and ctx is None and hvd.Compression.none.decompress(sent, ctx) is t
    assert issubclass(hvd.Compression.bf16, hvd.compression.Compressor)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))


def _sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_errors_are_raised_at_construction() -> None:
    m = _model()
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(_sgd(m), named_parameters=[("w", p) for p in m.parameters()])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(_sgd(m), named_parameters=list(m.named_parameters())[:2])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(_sgd(m), named_parameters=[p for _, p in m.named_parameters()])
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(_sgd(m), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(_sgd(m), op=hvd.Adasum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(_sgd(m), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(_sgd(m), groups=[[next(m.parameters())]] * 2)


def test_broadcast_parameters_rejects_a_bare_tensor_before_any_collective() -> None:
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters(torch.zeros(3), root_rank=0)


def test_elastic_is_reached_as_an_attribute() -> None:
    """`hvd.elastic` is Horovod's elastic API, imported on first use; other unknown names fail plainly."""
    assert hvd.elastic.run is not None and hvd.elastic.TorchState is not None
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = hvd.no_such_name


def test_defaults_are_horovods() -> None:
    """Defaults a Horovod script may rely on without naming them (horovod 0.28.1's signatures)."""
    import inspect

    def default(fn: object, arg: str) -> object:
        return inspect.signature(fn).parameters[arg].default  # type: ignore[arg-type]

    assert default(hvd.DistributedOptimizer, "process_set") is hvd.global_process_set
    assert default(hvd.DistributedOptimizer, "backward_passes_per_step") == 1
    assert default(hvd.DistributedOptimizer, "compression") is hvd.Compression.none
    assert default(hvd.broadcast_object, "process_set") is hvd.global_process_set
    assert default(hvd.broadcast_object, "root_rank") == 0
    for op in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter"):
        assert default(getattr(hvd, op), "process_set") is hvd.global_process_set, op
    assert default(hvd.allreduce, "op") is None  # None: `average=`'s default, then Average (Horovod's rule)
    assert default(hvd.reducescatter, "op") is hvd.Average
