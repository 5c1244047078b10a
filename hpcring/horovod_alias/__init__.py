"""`import horovod` in an unchanged Horovod script, answered by hpcring (`hpcring run --horovod`).

What it is: a finder at the front of `sys.meta_path` that answers `horovod` and the submodules Horovod
scripts import (`horovod.torch`, `.torch.mpi_ops`, `.torch.elastic[.sampler|.state]`, `.common.util`,
`.common.exceptions`, `.common.process_sets`, `.runner`, `.ray`) with modules that forward to hpcring's
(`table.py` lists them). A name hpcring lacks raises `HorovodFeatureMissing`, an AttributeError (so
`hasattr` still answers) whose message names the Horovod feature and what to use instead (the same message
as an ImportError, `HorovodNameUnavailable`, for `from horovod.x import name`); Horovod's
TensorFlow, Keras, MXNet and Spark packages raise `HorovodFrameworkUnavailable` (an ImportError) the same way.

How it reaches every rank, and why (one switch, `HPCRING_HOROVOD=1`, read in the rank itself):

- `import hpcring` installs the finder when `HPCRING_HOROVOD` is set. Every process that runs hpcring code
  before the user's imports gets it with nothing else: Python ranks of `hpcring run` (they start as
  `python -m hpcring.launch.pyrun`, which imports hpcring first), `hpcring.run`'s ranks, and the Ray workers
  (the actor sets the executor's variables before it starts its worker process).
- A rank whose command is not Python of hpcring's environment (a shell wrapper that calls python) never
  imports hpcring before `import horovod`. For those `hpcring run --horovod` also puts `site/` first on the
  ranks' PYTHONPATH: its `sitecustomize.py` installs the finder at interpreter start-up and then runs the
  `sitecustomize` it shadows, if any. The same two variables work under srun or mpirun without `hpcring run`:
  `HPCRING_HOROVOD=1 PYTHONPATH=$(python -m hpcring.horovod_alias --site-dir):$PYTHONPATH`.

A real Horovod installed beside it is never shadowed: `hpcring run --horovod` refuses to start, and a rank
whose `import horovod` would otherwise have found one gets an ImportError saying so (`real_horovod`).
"""

from __future__ import annotations

from hpcring.contracts.horovod_alias import (
    ENV_VARIABLE,
    SITE_DIR,
    rank_environment,
    real_horovod,
    refuse_if_real_horovod,
    requested,
)
from hpcring.horovod_alias.hook import install, install_from_env, installed, uninstall
from hpcring.horovod_alias.missing import (
    HorovodFeatureMissing,
    HorovodFrameworkUnavailable,
    HorovodNameUnavailable,
)

__all__ = [
    "ENV_VARIABLE",
    "SITE_DIR",
    "HorovodFeatureMissing",
    "HorovodFrameworkUnavailable",
    "HorovodNameUnavailable",
    "install",
    "install_from_env",
    "installed",
    "rank_environment",
    "real_horovod",
    "refuse_if_real_horovod",
    "requested",
    "uninstall",
]
