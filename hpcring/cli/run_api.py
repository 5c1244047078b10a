"""`hpcring.run(fn, ...)`: Horovod's `horovod.run`, over `hpcring run`'s own machinery.

The keywords are horovod.run's (0.28), with its names and defaults. Each becomes the `hpcring run` flag it
stands for and goes through that command's parser and checks (so HPCRING_* variables apply as they do to
`hpcring run`); the job is then run by the same Supervisor (or elastic driver), with one rank command:
`python -m hpcring.launch.run_rank FOLDER` (hpcring.launch.run_function says how the call travels).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, BinaryIO, NoReturn

from hpcring.cli import horovodrun_flags
from hpcring.cli import run as run_cli
from hpcring.contracts import horovod_alias
from hpcring.errors import ConfigError
from hpcring.launch.allocation import allocation_hosts
from hpcring.launch.hosts import is_local, parse_host_list
from hpcring.launch.run_function import collect, final_size, function_dir


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int = 1,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[float, float] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    start_timeout: float | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: int | bool | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run `func(*args, **kwargs)` on every rank of a new job; returns each rank's value, in rank order.

    As horovod.run: `num_proc` ranks (`np` is its deprecated spelling) on `hosts` ('host1:2,host2:4') or
    `hostfile`, else on the hosts of the batch allocation it runs in (Slurm, LSF, PBS), else on this
    machine; `min_num_proc`/`max_num_proc` (or `min_np`/`max_np`), `slots`, `reset_limit` and
    `cooldown_range` make the job elastic. `disable_cache` is accepted (hpcring caches no start-up checks);
    `use_gloo=True` is refused (hpcring runs over MPI). `env`: variables the ranks get on top of the
    caller's environment (which they inherit, HPCRING_HOROVOD included). A rank that raises makes
    the call raise RunFunctionError naming that rank and its host, with its traceback text.
    """
    num_proc, min_num_proc, max_num_proc = _deprecated(
        num_proc, np, min_num_proc, min_np, max_num_proc, max_np
    )
    if not callable(func):
        raise ConfigError(f"hpcring.run: func must be callable, got {type(func).__name__}")
    if use_gloo and use_mpi:
        raise ConfigError("hpcring.run: use_gloo and use_mpi cannot both be True")
    if use_gloo:
        raise ConfigError("hpcring.run(use_gloo=True): hpcring runs over MPI only; drop use_gloo")
    if use_mpi is False:
        raise ConfigError("hpcring.run(use_mpi=False): hpcring runs over MPI only; drop use_mpi")
    argv = _flags(
        num_proc=num_proc,
        min_num_proc=min_num_proc,
        max_num_proc=max_num_proc,
        slots=slots,
        reset_limit=reset_limit,
        cooldown_range=cooldown_range,
        hosts=hosts,
        hostfile=hostfile,
        start_timeout=start_timeout,
        ssh_port=ssh_port,
        ssh_identity_file=ssh_identity_file,
        output_filename=output_filename,
        verbose=verbose,
        mpi_args=mpi_args,
        network_interface=network_interface,
    )
    python = executable or sys.executable
    base_env = {**os.environ, **_env(env)}
    if horovod_alias.requested(base_env):
        argv.append("--horovod")  # the same refusal and rank environment as `hpcring run --horovod`
    return _launch(func, tuple(args), dict(kwargs or {}), argv, python, base_env, bool(verbose))


def _deprecated(
    num_proc: int,
    np: int | None,
    min_num_proc: int | None,
    min_np: int | None,
    max_num_proc: int | None,
    max_np: int | None,
) -> tuple[int, int | None, int | None]:
    """horovod.run's old names: np, min_np, max_np (a DeprecationWarning, as there)."""
    if np is not None:
        if num_proc not in (1, np):
            raise ConfigError(f"hpcring.run: num_proc={num_proc} and np={np} disagree; give num_proc only")
        num_proc = np
        warnings.warn("hpcring.run: np is deprecated, use num_proc", DeprecationWarning, stacklevel=3)
    if min_np is not None:
        min_num_proc = min_np if min_num_proc is None else min_num_proc
        warnings.warn("hpcring.run: min_np is deprecated, use min_num_proc", DeprecationWarning, stacklevel=3)
    if max_np is not None:
        max_num_proc = max_np if max_num_proc is None else max_num_proc
        warnings.warn("hpcring.run: max_np is deprecated, use max_num_proc", DeprecationWarning, stacklevel=3)
    return num_proc, min_num_proc, max_num_proc


def _count(name: str, value: Any, minimum: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"hpcring.run({name}={value!r}): expected a whole number >= {minimum}")
    return str(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"hpcring.run({name}={value!r}): expected a string, got {type(value).__name__}")
    return os.fspath(value)


def _flags(**kw: Any) -> list[str]:
    """horovod.run's keywords as `hpcring run` flags (`--flag=value`, so a value may start with '-')."""
    out = [f"-np={_count('num_proc', kw['num_proc'], 1)}"]
    if kw["hosts"] is not None:
        hosts = _text("hosts", kw["hosts"])
        try:
            parse_host_list(hosts)
        except ConfigError as exc:
            raise ConfigError(f"hpcring.run(hosts={hosts!r}): {exc}; expected 'host1:2,host2:4'") from None
        out.append(f"--hosts={hosts}")
    if kw["hostfile"] is not None:
        if kw["hosts"] is not None:
            raise ConfigError("hpcring.run: give either hosts or hostfile, not both")
        out.append(f"--hostfile={_text('hostfile', kw['hostfile'])}")
    if kw["hosts"] is None and kw["hostfile"] is None:
        out += _allocation_flags()
    for key, flag, minimum in (
        ("min_num_proc", "--min-np", 1),
        ("max_num_proc", "--max-np", 1),
        ("slots", "--slots-per-host", 1),
        ("reset_limit", "--reset-limit", 0),
        ("ssh_port", "--ssh-port", 1),
    ):
        if kw[key] is not None:
            out.append(f"{flag}={_count(key, kw[key], minimum)}")
    if kw["cooldown_range"] is not None:
        lo_hi = kw["cooldown_range"]
        if not isinstance(lo_hi, (tuple, list)) or len(lo_hi) != 2:
            raise ConfigError(f"hpcring.run(cooldown_range={lo_hi!r}): expected (min_seconds, max_seconds)")
        out += ["--blacklist-cooldown-range", str(lo_hi[0]), str(lo_hi[1])]
    timeout = kw["start_timeout"]
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(
                f"hpcring.run(start_timeout={timeout!r}): expected a positive number of seconds"
            )
        out.append(f"--start-timeout={timeout}")
    for key, flag in (
        ("ssh_identity_file", "--ssh-identity-file"),
        ("output_filename", "--output-filename"),
        ("mpi_args", "--mpi-args"),
        ("network_interface", "--network-interface"),
    ):
        if kw[key] is not None:
            out.append(f"{flag}={_text(key, kw[key])}")
    if kw["verbose"]:
        out.append("--verbose")
    return out


def _allocation_flags() -> list[str]:
    """In a batch allocation that spans other hosts, its hosts (unless HPCRING_HOSTS/_HOSTFILE name some)."""
    if os.environ.get("HPCRING_HOSTS") or os.environ.get("HPCRING_HOSTFILE"):
        return []
    found = allocation_hosts()
    if found is None or all(is_local(h.name) for h in found[1]):
        return []  # this machine only: the launcher's default
    return [f"--hosts={','.join(h.spec() for h in found[1])}"]


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError("hpcring.run(env=...): expected a dict of str to str")
    return dict(env)


def _raise_config(message: str) -> NoReturn:
    raise ConfigError(f"hpcring.run: {message}")


def _parse(argv: list[str], python: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hpcring.run", add_help=False)
    run_cli.register(parser)
    parser.error = _raise_config  # type: ignore[method-assign,assignment]
    return parser.parse_args([*argv, "--", python, "-m", "hpcring.launch.run_rank"])


def _launch(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    argv: list[str],
    python: str,
    base_env: dict[str, str],
    verbose: bool,
) -> list[Any]:
    from hpcring.launch.elastic.driver import ElasticDriver, ElasticSpec
    from hpcring.launch.flavour import resolve
    from hpcring.launch.supervisor import Supervisor

    ns = _parse(argv, python)
    horovodrun_flags.apply_config_file(ns)
    horovodrun_flags.refuse(ns)
    install = resolve(ns.mpi)
    spec = run_cli.build_spec(ns, install.flavour)
    elastic = horovodrun_flags.elastic_spec(ns, list(spec.hosts), spec.np)
    if elastic is None:
        spec.oversubscribed()  # validates the rank count against the hosts' slots before anything starts
    # Discovered hosts are not known yet: they may be other machines.
    shared = spec.remote or (isinstance(elastic, ElasticSpec) and elastic.discovery_script is not None)
    with function_dir(func, args, kwargs, shared=shared) as folder:
        spec = replace(spec, command=folder.rank_command(python))
        out, err = _stream(sys.stdout), _stream(sys.stderr)
        if isinstance(elastic, ElasticSpec):
            driver = ElasticDriver(install, replace(spec, hosts=()), elastic, env=base_env, stderr=err)
            status = _in_main_thread(driver.run)
            return collect(folder, final_size(folder) or spec.np, status, None, {})
        sup = Supervisor(install, spec, stdout=out, stderr=err, env=base_env)

        def show(cmd: list[str]) -> None:
            if verbose:
                print(
                    f"hpcring.run: {install.flavour} ({install.version}): {shlex.join(cmd)}", file=sys.stderr
                )

        status = _in_main_thread(lambda: sup.run(on_start=show))
        if sup.interrupted == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C ended every rank; the caller sees it as from any call
        hosts = {rank: conn.host for rank, conn in sup.conns.items()}
        return collect(folder, spec.np, status, sup.failure, hosts)


def _in_main_thread(job: Callable[[], int]) -> int:
    """The launcher installs signal handlers (Ctrl-C ends every rank), which only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("hpcring.run must be called from the main thread (the launcher handles signals)")
    return job()


class _TextSink:
    """Bytes into a text stream that has no binary buffer (a notebook's sys.stdout)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        self.stream.write(data.decode(errors="replace"))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


def _stream(stream: Any) -> BinaryIO:
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else _TextSink(stream)  # type: ignore[return-value]
