"""The asynchronous engine: named requests, negotiation with a response cache, fusion, stalls, timeline.

Framework-agnostic: requests carry numpy views and metadata; `hpcring.torch` adapts tensors. Importing this
package does not import mpi4py or torch (the engine loads them when it starts).
"""

from __future__ import annotations

from hpcring.engine.engine import Engine
from hpcring.engine.process_sets import ProcessSet, global_process_set
from hpcring.engine.request import Handle, OpType, Request, Signature, signature_shape
from hpcring.engine.responses import numpy_dtype

__all__ = [
    "Engine",
    "Handle",
    "OpType",
    "ProcessSet",
    "Request",
    "Signature",
    "global_process_set",
    "numpy_dtype",
    "signature_shape",
]
