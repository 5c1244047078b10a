"""One process of a world formed without a common mpiexec (tests/ray/test_rendezvous.py starts each as its
own `mpiexec -n 1` job): form the world through the store, initialise hpcring over it, print what it sees."""

from __future__ import annotations

import json
import sys

from hpcring.collective import runtime
from hpcring.launch import rendezvous
from hpcring.launch.rendezvous_store import StoreClient

address, token, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = StoreClient(address, token)
world = rendezvous.form_world(store, rank, size, key="test", timeout=60)
topo = runtime.init(world)
print(
    json.dumps(
        {
            "rank": world.Get_rank(),
            "size": world.Get_size(),
            "sum": world.allreduce(rank),
            "local_rank": topo.local_rank,
            "local_size": topo.local_size,
        }
    ),
    flush=True,
)
