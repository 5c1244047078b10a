"""Cross-rank validation of one named request: do all ranks agree on what they submitted?

Run on every rank over the same gathered signatures, so every rank reaches the same verdict and raises the
same error instead of some ranks hanging in a collective whose buffers do not match. Messages name the ranks
and the values that disagree, grouped by value, e.g. `shape: ranks 0, 2 have (4,); rank 1 has (5,)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcring.engine.request import OpType, Signature

# Which signature fields must agree for each op type (op_type and device always must).
_FIELDS: dict[OpType, tuple[str, ...]] = {
    OpType.ALLREDUCE: ("dtype", "shape", "reduce_op", "prescale", "postscale"),
    OpType.REDUCESCATTER: ("dtype", "shape", "reduce_op", "prescale", "postscale"),
    OpType.BROADCAST: ("dtype", "shape", "root"),
    OpType.ALLGATHER: ("dtype", "shape"),
    OpType.ALLTOALL: ("dtype", "shape"),
    OpType.BARRIER: (),
    OpType.JOIN: (),
    OpType.ADD_PROCESS_SET: ("extra",),
    OpType.REMOVE_PROCESS_SET: ("extra",),
    OpType.TUNE: (),  # the values of the set's rank 0 are applied (the tuner runs there, as Horovod's)
}

_LABEL = {
    "op_type": "operation",
    "device": "device",
    "dtype": "dtype",
    "shape": "shape",
    "reduce_op": "reduce op",
    "root": "root rank",
    "prescale": "prescale factor",
    "postscale": "postscale factor",
    "extra": "process set",
}


def _show(fieldname: str, value: Any) -> str:
    if isinstance(value, OpType):
        return value.value
    if fieldname == "shape" and value and value[0] == -1:
        trailing = ", ".join(str(d) for d in value[1:])
        return f"(*, {trailing})" if trailing else "(*,)"
    if fieldname == "extra":
        return str(list(value))
    return str(value)


def _ranks(ranks: Sequence[int]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(str(r) for r in ranks)}"


def describe_disagreement(fieldname: str, by_rank: Mapping[int, Any]) -> str:
    """`shape: ranks 0, 2 have (4,); rank 1 has (5,)`: world ranks grouped by value, by first rank."""
    groups: dict[str, list[int]] = {}
    for r in sorted(by_rank):
        groups.setdefault(_show(fieldname, by_rank[r]), []).append(r)
    parts = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {val}" for val, rs in groups.items()]
    return f"{_LABEL.get(fieldname, fieldname)}: {'; '.join(parts)}"


def check_agreement(sigs: Mapping[int, Signature], world_ranks: Sequence[int]) -> str | None:
    """None when every submitted signature agrees; otherwise the error message (identical on every rank).

    `sigs` maps process-set rank to signature; `world_ranks[i]` is the world rank of set rank i
    (messages speak world ranks, which is what users see in their logs).
    """
    first = sigs[min(sigs)]
    if list(sigs.values()).count(first) == len(sigs):  # equal signatures agree in every field (a set of one)
        return None
    name = first.name
    op_types = {world_ranks[r]: s.op_type for r, s in sigs.items()}
    if len(set(op_types.values())) > 1:
        return (
            f"Mismatched operations for tensor {name!r} across ranks; "
            f"{describe_disagreement('op_type', op_types)}. "
            "Every rank must submit the same collective under a given name."
        )
    problems = []
    for fieldname in ("device", *_FIELDS[first.op_type]):
        values = {world_ranks[r]: getattr(s, fieldname) for r, s in sigs.items()}
        if len(set(values.values())) > 1:
            problems.append(describe_disagreement(fieldname, values))
    if not problems:
        return None
    what = first.op_type.value
    hint = (
        " (all dimensions but the first must match)"
        if first.op_type in (OpType.ALLGATHER, OpType.ALLTOALL)
        else ""
    )
    return f"Mismatched {what} of tensor {name!r} across ranks{hint}: " + "; ".join(problems)
