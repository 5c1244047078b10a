"""Queries on the registered process sets: `process_set_included` and `get_process_set_ids_and_ranks`.

Horovod 0.28 answers both from its C++ process-set table (`horovod_process_set_included`, and
`HorovodBasics._get_process_set_ids_and_ranks`, which `hvd.init` uses to bind ProcessSet objects); here the
engine's table is the same truth, kept identical on every rank by the collective add/remove.
"""

from __future__ import annotations

from hpcring.torch import basics


def get_process_set_ids_and_ranks() -> dict[int, list[int]]:
    """{process set id: its world ranks} for every registered set, the global set (id 0) included.

    ValueError before `init()`, as Horovod's."""
    engine = basics.engine()
    ids = {0, *(ps.process_set_id for ps in basics.registered_process_sets())}
    return {sid: list(engine.set_ranks(sid)) for sid in sorted(i for i in ids if i is not None)}


def process_set_included(process_set_id: int = 0) -> bool:
    """Whether this rank belongs to the process set with this id (always, for the global set 0).

    ValueError before `init()` and for an id that is not registered (never added, or removed), as
    Horovod's `horovod_process_set_included` answers with its error codes."""
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, int):
        raise ValueError(f"process_set_id must be an int, got {process_set_id!r}")
    engine = basics.engine()
    if process_set_id == 0:
        return True
    try:
        ranks = engine.set_ranks(process_set_id)
    except ValueError:
        raise ValueError(f"Process set {process_set_id} does not exist or has not been registered.") from None
    return engine.world_rank in ranks
