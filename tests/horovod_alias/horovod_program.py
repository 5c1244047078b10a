"""A Horovod training script as a user has it, written against Horovod (run by test_horovod_launch.py).

`import horovod` must resolve to hpcring: under `hpcring run --horovod`, with the env twin, behind a shell
wrapper, or in a plain interpreter given HPCRING_HOROVOD=1 and the alias's site folder on PYTHONPATH.
"""

import sys

import horovod
import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError
from horovod.common.util import check_extension

check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__, "mpi_lib_v2")
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="script.sum").item()
print(
    f"horovod-script rank={hvd.rank()} size={hvd.size()} sum={total:g} "
    f"run={callable(horovod.run)} error={HorovodInternalError.__module__} from={hvd.allreduce.__module__}"
)
hvd.shutdown()
sys.exit(0)
