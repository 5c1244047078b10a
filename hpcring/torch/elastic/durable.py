"""Durable checkpoints of `hvd.elastic` state in the job's shared `--checkpoint-dir`, written on a wall-clock
warning and resumed by the requeued job (docs/guide/elastic.md, "Longer than the wall clock").

Unlike the node-local commit store (`store.py`, in /dev/shm, gone with the job) a checkpoint here must
survive the job and a node's crash: every file is written to a temporary name, fsynced, renamed and its
folder fsynced.
One checkpoint is a folder `checkpoint-<commit>-<stop>`: the state as rank 0 committed it (`state.commit`,
the commit store's format), each rank's RNG states (`rng-<rank>.commit`: torch, numpy, Python's `random`,
CUDA when in use) and, written last once every rank's files are durable, `COMPLETE.json`. A folder without it
is ignored, and the previous checkpoint is removed only after the new one is complete.

The folder is the job's own: its files are trusted as much as the commit store's (a pickled header).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcring.contracts import wallclock as contract
from hpcring.files import write_whole
from hpcring.torch import basics, wallclock
from hpcring.torch.elastic import store
from hpcring.torch.functions import broadcast_object

if TYPE_CHECKING:
    from hpcring.torch.elastic.common import ObjectState

PREFIX = "checkpoint-"
MANIFEST = "COMPLETE.json"
PROGRESS = "progress.json"  # rank 0's last commit (not fsynced): how much a job killed without warning lost
STATE = "state.commit"
_FIELDS = {"seq": int, "stop": int, "size": int, "kind": str, "written": float, "requeues": dict}

_resumed: dict[str, Any] | None = None  # the manifest this job resumed from (its requeue counts)


def write_durable(path: Path, data: bytes | bytearray) -> None:
    """`path` holds `data` whole, on stable storage, before this returns (or the old file stands)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A complete checkpoint's manifest; None when the folder is incomplete or its manifest is not ours."""
    try:
        data = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for name, kind in _FIELDS.items():
        value = data.get(name)
        if kind is float and isinstance(value, int):
            value = data[name] = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    counts = data["requeues"]
    if set(counts) != {contract.LIMIT, contract.PREEMPT} or not all(
        isinstance(v, int) and v >= 0 for v in counts.values()
    ):
        return None
    return data


def newest(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint in `directory` (highest commit, then highest stop), or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    best: tuple[tuple[int, int], Path, dict[str, Any]] | None = None
    for folder in root.glob(f"{PREFIX}*"):
        manifest = read_manifest(folder) if folder.is_dir() else None
        if manifest is not None:
            key = (manifest["seq"], manifest["stop"])
            if best is None or key > best[0]:
                best = (key, folder, manifest)
    return None if best is None else (best[1], best[2])


# ---- RNG states -------------------------------------------------------------------------------------------
def _rng_snapshot() -> dict[str, Any]:
    import torch

    snap: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        snap["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        snap["cuda"] = torch.cuda.get_rng_state_all()
    return snap


def _rng_restore(snap: dict[str, Any]) -> None:
    import torch

    random.setstate(snap["python"])
    torch.set_rng_state(snap["torch"].clone())
    if "numpy" in snap:
        import numpy as np

        np.random.set_state(snap["numpy"])
    if "cuda" in snap and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.clone() for t in snap["cuda"]])


# ---- stop -------------------------------------------------------------------------------------------------
def _say(text: str) -> None:
    if basics.rank() == 0:
        sys.stdout.flush()
        print(f"hpcring requeue: {text}", file=sys.stderr, flush=True)


def at_commit(state: ObjectState) -> None:
    """Called by `state.commit()` after its save: in a job with a checkpoint directory, agree on the
    wall-clock warning; if any rank received one, checkpoint durably and exit with the requeue status."""
    directory = contract.checkpoint_dir()
    if directory is None:
        return
    if basics.rank() == 0:
        _progress(Path(directory), state)
    kind = agree()
    if kind is not None:
        stop(state, Path(directory), kind)


def agree() -> str | None:
    """Every rank's verdict on the warning: the strongest kind any rank has received, the same everywhere.
    A collective: every rank calls it at the same commit."""
    import torch

    from hpcring.torch.mpi_ops import Max, allreduce

    kinds = [wallclock.received()]
    directory = contract.checkpoint_dir()
    if basics.rank() == 0 and directory is not None:
        kinds.append(contract.read_warning(directory))  # a batch script's trap (one stat per commit)
    mine = torch.tensor([max(wallclock.CODES.get(k or "", 0) for k in kinds)], dtype=torch.int32)
    code = int(allreduce(mine, op=Max, name="hpcring.wallclock.agree")[0])
    return wallclock.KINDS.get(code)


def _progress(directory: Path, state: ObjectState) -> None:
    step = getattr(state, "step", None)
    record = {"seq": state._seq, "step": step if isinstance(step, int) else None, "time": time.time()}
    with contextlib.suppress(OSError):  # a record for the log line only: never worth failing a commit
        write_whole(directory / PROGRESS, json.dumps(record).encode())


def _lost(directory: Path, manifest: dict[str, Any]) -> str:
    """What the last job did after this checkpoint and lost (it was killed without a warning)."""
    try:
        record = json.loads((directory / PROGRESS).read_bytes())
        seq, step = int(record["seq"]), record.get("step")
    except (OSError, ValueError, KeyError, TypeError):
        return "steps lost: unknown (no progress record)"
    if seq <= manifest["seq"]:
        return "steps lost: 0"
    if isinstance(step, int) and isinstance(manifest.get("step"), int):
        return f"steps lost: {step - manifest['step']} ({seq - manifest['seq']} commits)"
    return f"commits lost: {seq - manifest['seq']}"


def stop(state: ObjectState, directory: Path, kind: str) -> None:
    """Write the checkpoint of the state just committed, then leave every rank with the requeue status."""
    started = time.monotonic()
    counts = dict(_resumed["requeues"]) if _resumed else {contract.LIMIT: 0, contract.PREEMPT: 0}
    counts[kind] += 1
    bound = contract.max_requeues()[kind]
    requeue = bound is None or counts[kind] <= bound
    stops = counts[contract.LIMIT] + counts[contract.PREEMPT]
    folder = directory / f"{PREFIX}{state._seq:012d}-{stops:04d}"
    folder.mkdir(parents=True, exist_ok=True)
    rank = basics.rank()
    if rank == 0:
        write_durable(folder / STATE, store.encode_bytes(state._seq, state._snapshot()))
    write_durable(folder / f"rng-{rank}{store.SUFFIX}", store.encode_bytes(state._seq, _rng_snapshot()))
    basics.barrier()  # every rank's files are durable: the checkpoint may be declared complete
    step = getattr(state, "step", None)
    if rank == 0:
        manifest = {
            "seq": state._seq,
            "stop": stops,
            "step": step if isinstance(step, int) else None,
            "size": basics.size(),
            "kind": kind,
            "written": time.time(),
            "requeues": counts,
        }
        write_durable(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
        _prune(directory, keep=folder)
    basics.barrier()
    what = "time limit" if kind == contract.LIMIT else "preemption"
    where = f"commit {state._seq}" + (f" (step {step})" if isinstance(step, int) else "")
    of = f" of {bound}" if bound is not None else ""
    if requeue:
        tail = f"{what} requeue {counts[kind]}{of}: exiting with {contract.REQUEUE_EXIT_CODE} to be requeued"
    else:
        tail = (
            f"{what} requeues: {bound} of {bound} done, not requeuing (exit {contract.STOPPED_EXIT_CODE}); "
            "resubmit with the same --checkpoint-dir to continue"
        )
    elapsed = time.monotonic() - started
    _say(f"{what} warning: checkpoint of {where} written to {folder} in {elapsed:.2f} s; {tail}")
    sys.stderr.flush()
    os._exit(contract.REQUEUE_EXIT_CODE if requeue else contract.STOPPED_EXIT_CODE)


def _prune(directory: Path, keep: Path) -> None:
    """Remove every other checkpoint folder (older ones, and incomplete ones a killed job left)."""
    for folder in directory.glob(f"{PREFIX}*"):
        if folder != keep and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


# ---- resume -----------------------------------------------------------------------------------------------
def resume(state: ObjectState) -> bool:
    """At the start of `@hvd.elastic.run`: load the newest complete checkpoint into every rank's state (and
    each rank's RNG states, when the world has the size that wrote them); False when there is none."""
    global _resumed
    directory = contract.checkpoint_dir()
    if directory is None:
        return False
    found = newest(directory) if basics.rank() == 0 else None
    info = broadcast_object(
        None if found is None else (str(found[0]), found[1]), root_rank=0, name="hpcring.requeue.resume"
    )
    if info is None:
        _say(f"no checkpoint in {directory} yet: starting from the beginning")
        return False
    folder, manifest = Path(info[0]), info[1]
    if basics.rank() == 0:
        state._pending = store.read_bytes(folder / STATE)
    state._sync_root = 0
    state.sync()
    same_world = manifest["size"] == basics.size()
    if same_world:
        _restore_own_rng(folder)
    _resumed = manifest
    _say(_resume_line(folder, manifest, same_world) + "; " + _lost(Path(directory), manifest))
    return True


def _restore_own_rng(folder: Path) -> None:
    """This rank's RNG states from the checkpoint; a missing or unreadable file (a folder that is not shared
    by the nodes) is said on this rank's stderr and training goes on with fresh states."""
    path = folder / f"rng-{basics.rank()}{store.SUFFIX}"
    try:
        _seq, snap = store.read(path)
        _rng_restore(snap)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"hpcring requeue: rank {basics.rank()}: RNG states not restored from {path}: {exc}",
            file=sys.stderr,
        )


def _resume_line(folder: Path, manifest: dict[str, Any], same_world: bool) -> str:
    counts = manifest["requeues"]
    step = manifest.get("step")
    where = f"commit {manifest['seq']}" + (f" (step {step})" if isinstance(step, int) else "")
    ago = time.time() - manifest["written"]
    rng = "RNG states restored"
    if not same_world:
        rng = f"a world of {manifest['size']} wrote it: RNG states not restored"
    return (
        f"resuming after requeue {manifest['stop']} ({counts[contract.LIMIT]} for the time limit, "
        f"{counts[contract.PREEMPT]} for preemption) from {where} of {folder}, checkpointed {ago:.1f} s ago; "
        f"{rng}"
    )


def resumed_world_size() -> int | None:
    """The world size that wrote the checkpoint this job resumed from (None when it did not resume)."""
    return None if _resumed is None else int(_resumed["size"])
