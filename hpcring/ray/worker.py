"""The MPI worker process of one Ray actor: `mpiexec -n 1 python -m hpcring.ray.worker`, started by the actor.

It connects back to its actor (HPCRING_RAY_CHANNEL=host:port), receives its rank, the world size and the
rendezvous store, forms the world with the other workers (`hpcring.launch.rendezvous`), initialises hpcring
over it, builds the executable object, then runs the functions the actor relays until told to stop.

hpcring is initialised over the formed world before every call (when it is not already), so a function's
own `hvd.init()` finds it running and uses it, and `hvd.shutdown()` at the end of one call does not leave
the next one on a one-process COMM_WORLD. The process leaves with `os._exit`: `MPI_Finalize` would wait for
every connected process, and a dead peer would make it wait forever. It also leaves when its actor dies.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

from hpcring.ray import channel, output_stamp

CHANNEL_VARIABLE = "HPCRING_RAY_CHANNEL"
ACTOR_PID_VARIABLE = "HPCRING_RAY_ACTOR_PID"
FINALIZE_TIMEOUT_S = 5.0
PRELOAD_VARIABLE = "HPCRING_RAY_PRELOAD"  # modules a worker imports while it waits (comma-separated)


def _watch_actor(pid: int) -> None:
    """End this process when the actor that started it is gone (killed actors leave no orphans)."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass


def _preload() -> None:
    """Import what training needs before the spec arrives: a standby worker (elastic runs) is started
    while the previous world trains, so a re-formed world does not wait for torch's import (seconds)."""
    for name in filter(None, os.environ.get(PRELOAD_VARIABLE, "mpi4py.MPI,hpcring.torch").split(",")):
        with contextlib.suppress(ImportError):
            importlib.import_module(name.strip())


def _form(spec: dict[str, Any]) -> Any:
    from hpcring.launch import rendezvous
    from hpcring.launch.rendezvous_store import StoreClient

    store = StoreClient(spec["store"], spec["token"])
    try:
        return rendezvous.form_world(
            store, spec["rank"], spec["size"], key=spec["key"], timeout=spec["timeout"]
        )
    finally:
        store.close()


def _ensure_initialised(world: Any) -> None:
    from hpcring.collective import runtime

    if not runtime.is_initialized():
        runtime.init(world)


def _serve(sock: socket.socket, world: Any, executable: Any) -> None:
    while True:
        message = channel.recv(sock)
        if message[0] == "stop":
            return
        _ensure_initialised(world)
        try:
            reply: tuple[Any, ...] = ("ok", message[1](executable))
        except BaseException as exc:  # reported to the driver, which decides what ends
            reply = ("error", traceback.format_exc(), _picklable(exc))
        sys.stdout.flush()
        sys.stderr.flush()
        channel.send(sock, reply)


def _finalize(world: Any, timeout: float) -> None:
    """On an orderly stop (every worker of the world is told at once), shut hpcring down and finalise MPI,
    which removes MPICH's shared-memory segment of this job (os._exit alone leaves one in /dev/shm per
    worker). Finalize waits for every connected process, so it runs on a thread given `timeout` seconds."""

    def leave() -> None:
        with contextlib.suppress(Exception):
            torch_api = sys.modules.get("hpcring.torch")
            if torch_api is not None:
                torch_api.shutdown()
            from hpcring.collective import runtime

            runtime.shutdown()
            world.Free()
            from mpi4py import MPI

            MPI.Finalize()

    thread = threading.Thread(target=leave, daemon=True)
    thread.start()
    thread.join(timeout)


def _picklable(exc: BaseException) -> BaseException | None:
    try:
        channel.dumps(exc)
    except Exception:
        return None
    return exc


def main() -> None:
    """Connect to the actor, form the world, serve calls; always leave with os._exit."""
    host, _, port = os.environ[CHANNEL_VARIABLE].rpartition(":")
    threading.Thread(target=_watch_actor, args=(int(os.environ[ACTOR_PID_VARIABLE]),), daemon=True).start()
    sock = socket.create_connection((host, int(port)))
    channel.present(sock, os.environ.pop(channel.TOKEN_VARIABLE, ""))
    code = 0
    try:
        channel.send(sock, ("hello", os.getpid()))
        _preload()
        spec = channel.recv(sock)
        os.environ.update(spec.get("env", {}))
        output_stamp.install_from_env(spec["rank"])
        try:
            world = _form(spec)
            _ensure_initialised(world)
            cls, args, kwargs = spec["executable"]
            executable = cls(*args, **kwargs) if cls is not None else None
        except BaseException:
            channel.send(sock, ("failed", traceback.format_exc()))
            raise
        channel.send(sock, ("ready", {"pid": os.getpid(), "host": socket.gethostname()}))
        _serve(sock, world, executable)
        _finalize(world, FINALIZE_TIMEOUT_S)
    except EOFError:  # the actor went away
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
