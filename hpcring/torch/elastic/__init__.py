"""`hvd.elastic`: Horovod's elastic training API for `hpcring.torch` (docs/guide/elastic.md).

`@hvd.elastic.run`, `State`, `ObjectState`, `TorchState`, `ElasticSampler`, `HostsUpdatedInterrupt`,
`HorovodInternalError`. Under `hpcring run --min-np ...` commits go to node-local memory and a world that
loses or gains hosts is relaunched from the newest commit; the script does not change.
"""

from __future__ import annotations

from hpcring.errors import CollectiveError as HorovodInternalError
from hpcring.torch.elastic.common import HostsUpdatedInterrupt, ObjectState, State
from hpcring.torch.elastic.runner import run
from hpcring.torch.elastic.sampler import ElasticSampler
from hpcring.torch.elastic.state import TorchState, get_handler_registry, set_handler_registry

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "get_handler_registry",
    "run",
    "set_handler_registry",
]
