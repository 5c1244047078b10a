"""The compiled request path (src/*.c): the same interface as `fallback`, plus Submitter, LoneCycle and MPI
waiting."""

from collections.abc import Callable, Sequence
from typing import Any

class Handle:
    name: str
    event: Any
    def __init__(self, name: str) -> None: ...
    def done(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> Any: ...
    def set_result(self, result: Any) -> None: ...
    def set_error(self, error: BaseException) -> None: ...

class Request:
    sig: Any
    process_set_id: int
    tensor: Any
    output: Any
    splits: Any
    handle: Handle
    submitted_at: float
    ready: Any
    def __init__(
        self,
        sig: Any,
        process_set_id: int,
        tensor: Any = None,
        output: Any = None,
        splits: Any = None,
        handle: Handle | None = None,
        submitted_at: float | None = None,
        ready: Any = None,
    ) -> None: ...

class Pending:
    handles: Sequence[Handle]
    finish: Callable[[list[Any]], Any] | None
    keep: Any
    def __init__(
        self, handles: list[Handle], finish: Callable[[list[Any]], Any] | None, keep: Any = None
    ) -> None: ...
    def result(self, results: list[Any]) -> Any: ...

class Lock:
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *args: object) -> None: ...

class Submitter:
    groups_open: int
    def __init__(
        self,
        *,
        basics: Any,
        tls: Any,
        defer: Any,
        deferring: list[None],
        handle_map: dict[int, Pending],
        handle_ids: Any,
        op_names: dict[int, str],
        average_op: Any,
        adasum_name: str,
        tensor_type: type,
        strided: Any,
        set_type: type,
        dtypes: dict[Any, tuple[str, int, int]],
        sig_type: type,
        allreduce: Any,
        after_device: Callable[[list[Handle]], None],
        reader: Any,
        scalar_types: tuple[tuple[str, int, int] | None, ...],
        noname: dict[tuple[int, int, str], Any],
    ) -> None: ...
    def allreduce(
        self,
        tensor: Any,
        output: Any,
        name: Any,
        op: Any,
        average: Any,
        pre: Any,
        post: Any,
        process_set: Any,
        draw: bool = False,
        /,
    ) -> Any: ...
    def synchronize(self, handle: Any, /) -> Any: ...
    def group(self, delta: int, /) -> None: ...

class Entry:
    def __init__(self, submitter: Submitter, fallback: Callable[..., Any], default_set: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class LoneCycle:
    """CallerCycles.run_inline with the plain cycles of a lone small host allreduce in C (lone_cycle.py)."""

    def __init__(
        self,
        *,
        engine: Any,
        state: Any,
        callers: Any,
        wake_put: Callable[[None], None],
        python_cycle: Callable[[], bool],
        conclude: Callable[[Any, float, int, int, int], bool],
        watchdog: Any,
        negotiation: str,
        exchange: str,
        response_type: type,
        ended_type: type,
        error_type: type,
        describe: Callable[[Any, Any], tuple[Any, ...]],
        allreduce: Any,
        handle_size: int,
        in_place: int,
    ) -> None: ...
    def run_inline(self, handle: Any, deferred: bool = False, /) -> None: ...
    def cycle(self) -> bool: ...

def complete(
    handles: Sequence[Handle], results: Sequence[Any] | None, error: BaseException | None = None
) -> None: ...
def bind_mpi(path: str, /) -> bool: ...
def mpi_bound() -> bool: ...
def wait_mpi(address: int, /) -> None: ...
