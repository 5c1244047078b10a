"""The Horovod-script suite: launched with `hpcring run --horovod`, so `import horovod` resolves to hpcring.

Nothing here imports `horovod` at module level: the outer pytest collects these files outside any job,
where the alias is not installed (docs/dev/testing.md, "Collection must not depend on the launch").
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def horovod_torch(hvd: ModuleType) -> Iterator[ModuleType]:
    """`import horovod.torch as hvd`, initialised as a Horovod script does (the ranked `hvd` fixture's
    hpcring.torch, which it answers with, is already running; init() is idempotent)."""
    import horovod.torch as horovod_hvd

    horovod_hvd.init()
    yield horovod_hvd
