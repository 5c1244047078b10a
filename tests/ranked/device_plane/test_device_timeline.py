"""The timeline of device-plane collectives: valid Chrome trace, the usual spans per tensor, and on 2 emulated
nodes with the hierarchical allreduce forced the three stages nested inside each tensor's COLLECTIVE span."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from device_cases import DEVICE, STAGES, check_stages_nested, hierarchical_forced, record, spans


def test_device_timeline(hvd: ModuleType, comm: Any, shared_tmp: Path) -> None:
    n, r = hvd.size(), hvd.rank()

    def work() -> None:
        group = [torch.full((k + 5,), float(r), device=DEVICE) for k in range(3)]
        hvd.grouped_allreduce(group, op=hvd.Sum, name="dtl.fused")
        y = hvd.allreduce(torch.ones(4096, device=DEVICE), op=hvd.Sum, name="dtl.lone")
        assert y[0].item() == n
        hvd.allgather(torch.ones(2, device=DEVICE), name="dtl.gather")

    events = record(hvd, comm, shared_tmp, "device", work)
    if events is None:
        return
    names = {e["name"] for e in events}
    assert {"ALLREDUCE", "QUEUE", "COLLECTIVE", "ALLGATHER", "NEGOTIATE_ALLREDUCE"} <= names, names
    assert {"MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"} <= names  # the fused batch
    for tensor in ("allreduce.dtl.fused.0", "allreduce.dtl.lone"):
        if hierarchical_forced():
            check_stages_nested(events, tensor)
        else:
            assert not any(stage in k for k in spans(events, tensor) for stage in STAGES)
