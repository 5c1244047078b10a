"""A Horovod script's imports and calls, unchanged, under `hpcring run --horovod` (1, 2 and 4 ranks).

Each test is shaped like the Horovod code it stands for (`import horovod.torch as hvd`, `from
horovod.common.util import check_extension`, ...) and checks both that the name resolves to hpcring's own
object and that it behaves, with expectations computed from the rank and the world size.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest
import torch


def test_the_alias_is_installed_in_every_rank() -> None:
    from hpcring.horovod_alias import installed

    assert os.environ.get("HPCRING_HOROVOD") == "1"
    assert installed()


def test_horovod_modules_resolve_to_hpcring(horovod_torch: ModuleType) -> None:
    import horovod
    import horovod.torch.mpi_ops as mpi_ops
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    from horovod.torch.elastic import ElasticSampler, TorchState, run
    from horovod.torch.elastic.sampler import ElasticSampler as SamplerFromModule
    from horovod.torch.elastic.state import TorchState as StateFromModule

    import hpcring.torch
    import hpcring.torch.elastic

    assert horovod.torch is horovod_torch
    for name in ("allreduce", "DistributedOptimizer", "broadcast_parameters", "SyncBatchNorm", "Compression"):
        assert getattr(horovod_torch, name) is getattr(hpcring.torch, name)
    assert mpi_ops.allreduce_async_ is hpcring.torch.allreduce_async_
    assert mpi_ops.size() == hpcring.torch.size()
    assert ElasticSampler is SamplerFromModule is hpcring.torch.elastic.ElasticSampler
    assert TorchState is StateFromModule is hpcring.torch.elastic.TorchState
    assert run is hpcring.torch.elastic.run
    assert horovod_torch.elastic.run is run  # reached as an attribute, as scripts do
    assert HorovodInternalError is horovod_torch.HorovodInternalError
    assert HostsUpdatedInterrupt is horovod_torch.HostsUpdatedInterrupt
    assert callable(horovod.run)
    from horovod.runner import run as runner_run

    assert runner_run is horovod.run


def test_check_extension_as_horovod_scripts_call_it() -> None:
    from horovod.common.util import check_extension, extension_available

    check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__, "mpi_lib_v2")
    assert extension_available("torch")
    with pytest.raises(ImportError, match=r"horovod\.tensorflow.*PyTorch"):
        check_extension("horovod.tensorflow", "HOROVOD_WITH_TENSORFLOW", __file__, "mpi_lib")


def test_collectives_through_the_alias(horovod_torch: ModuleType, comm: object) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    assert size == comm.Get_size()  # type: ignore[attr-defined]
    assert rank == comm.Get_rank()  # type: ignore[attr-defined]
    total = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum, name="alias.sum")
    torch.testing.assert_close(total, torch.full((3,), float(size * (size - 1) // 2)))
    mean = hvd.allreduce(torch.full((2,), float(rank + 1)), name="alias.mean")
    torch.testing.assert_close(mean, torch.full((2,), (size + 1) / 2))
    gathered = hvd.allgather(torch.tensor([rank]), name="alias.gather")
    assert gathered.tolist() == list(range(size))


def test_missing_names_name_the_horovod_feature(horovod_torch: ModuleType) -> None:
    import horovod
    import horovod.ray

    from hpcring.horovod_alias import HorovodFeatureMissing, HorovodFrameworkUnavailable

    assert not hasattr(horovod_torch, "no_such_feature")
    with pytest.raises(HorovodFeatureMissing, match=r"Horovod's horovod\.torch\.no_such_feature"):
        horovod_torch.no_such_feature  # noqa: B018
    with pytest.raises(HorovodFeatureMissing, match=r"horovod\.ray\.BaseHorovodWorker.*executable_cls"):
        horovod.ray.BaseHorovodWorker  # noqa: B018
    with pytest.raises(HorovodFrameworkUnavailable, match=r"horovod\.tensorflow.*PyTorch only"):
        import horovod.tensorflow
    with pytest.raises(HorovodFrameworkUnavailable, match=r"horovod\.spark\.keras.*TorchEstimator"):
        import horovod.spark.keras


def test_process_set_queries(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    assert hvd.process_set_included(0) is True
    assert hvd.get_process_set_ids_and_ranks() == {0: list(range(size))}
    if size == 1:  # the only possible set is the global one, which cannot be added twice
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set([0])
        return
    last = hvd.add_process_set([size - 1])
    try:
        assert hvd.process_set_included(last.process_set_id) is (rank == size - 1)
        assert hvd.get_process_set_ids_and_ranks() == {0: list(range(size)), last.process_set_id: [size - 1]}
    finally:
        removed = last.process_set_id
        hvd.remove_process_set(last)
    with pytest.raises(ValueError, match="does not exist or has not been registered"):
        hvd.process_set_included(removed)
    assert hvd.get_process_set_ids_and_ranks() == {0: list(range(size))}
