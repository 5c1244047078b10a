"""`hpcring run` end to end: real mpiexec (Open MPI and MPICH wheels), real ranks, real signals.

Launches are the expensive part on 2 cores, so each test checks several things about one launch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from support import ROOT, RunRanks, flavour_python

PROGRAM = str(Path(__file__).with_name("rank_program.py"))
PREFIX = re.compile(rb"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def prefixed(text: str, stream: str) -> dict[int, list[str]]:
    """Lines of `[r]<stream>:...` output by rank; any other line must be the launcher's or MPI's own."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = PREFIX.match(line.encode())
        if m:
            assert m.group(2).decode() == stream, line
            out.setdefault(int(m.group(1)), []).append(m.group(3).decode())
    return out


def expected_places(np: int, nodes: int) -> list[tuple[int, int, int, int]]:
    """(local_rank, local_size, cross_rank, cross_size) of each rank for contiguous node blocks."""
    node = [r * nodes // np for r in range(np)]
    out = []
    for r in range(np):
        members = [q for q in range(np) if node[q] == node[r]]
        local = members.index(r)
        cross = [n for n in range(nodes) if sum(1 for q in range(np) if node[q] == n) > local]
        out.append((local, len(members), cross.index(node[r]), len(cross)))
    return out


@pytest.mark.parametrize(
    ("flavour", "np", "nodes"),
    [
        ("openmpi", 1, None),
        ("openmpi", 2, None),
        ("openmpi", 4, None),
        ("openmpi", 4, 2),
        ("openmpi", 3, 2),
        ("mpich", 2, None),
        ("mpich", 4, 3),
    ],
)
def test_rank_environment_and_prefix(hpcring_run: RunRanks, flavour: str, np: int, nodes: int | None) -> None:
    settings = [
        "--fusion-threshold-mb",
        "2",
        "--cycle-time-ms",
        "3.5",
        "--cache-capacity",
        "64",
        "--timeline-filename",
        "tl.json",
        "--timeline-mark-cycles",
        "--stall-check-warning-time-seconds",
        "30",
        "--stall-check-shutdown-time-seconds",
        "90",
        "--no-stall-check",
        "--allreduce-algorithm",
        "ring",
        "--log-level",
        "DEBUG",
    ]
    proc = hpcring_run(np, ["{python}", PROGRAM, "env"], flavour=flavour, emulate_nodes=nodes, extra=settings)
    assert proc.returncode == 0, proc.stderr
    # The first line says what starts: ranks, hosts and slots, (emulated nodes), the MPI and its launcher.
    mpiexec = str(Path(flavour_python(flavour)).parent / "mpiexec")
    name = {"openmpi": "Open MPI", "mpich": "MPICH"}[flavour]
    nodes_said = f" as {nodes} emulated nodes" if nodes else ""
    ranks = f"{np} rank{'s' if np > 1 else ''}"
    startup = rf"hpcring run: {ranks} on {re.escape(socket.gethostname())}:{np}{nodes_said} with {name} "
    assert re.fullmatch(startup + rf"\d+(\.\d+)+ \({re.escape(mpiexec)}\)", proc.stderr.splitlines()[0]), (
        proc.stderr
    )
    out = prefixed(proc.stdout, "stdout")
    err = prefixed(proc.stderr, "stderr")
    assert sorted(out) == list(range(np)) and sorted(err) == list(range(np))
    envs = {r: json.loads(lines[0]) for r, lines in out.items()}
    places = expected_places(np, nodes or 1)
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for r, env in envs.items():
        local, local_size, cross, cross_size = places[r]
        assert err[r] == [f"rank {r} on stderr"]
        assert env["HPCRING_RANK"] == env["RANK"] == str(r)
        assert env["HPCRING_SIZE"] == env["WORLD_SIZE"] == str(np)
        assert env["HPCRING_LOCAL_RANK"] == env["LOCAL_RANK"] == str(local)
        assert env["HPCRING_LOCAL_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(local_size)
        assert (env["HPCRING_CROSS_RANK"], env["HPCRING_CROSS_SIZE"]) == (str(cross), str(cross_size))
        # horovodrun's names for the same place (a Horovod script reads these)
        horovod = [env[f"HOROVOD_{k}"] for k in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")]
        assert horovod == [str(r), str(np), str(local), str(local_size)]
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == (str(cross), str(cross_size))
        assert env["HOROVOD_HOSTNAME"] == socket.gethostname()
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["HPCRING_EMULATE_NODES"] == (str(nodes) if nodes else None)
        assert env["HPCRING_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert env["HPCRING_CYCLE_TIME"] == "3.5"
        assert env["HPCRING_CACHE_CAPACITY"] == "64"
        assert env["HPCRING_TIMELINE"] == str(ROOT / "tl.json")
        assert env["HPCRING_TIMELINE_MARK_CYCLES"] == "1"
        assert env["HPCRING_STALL_CHECK_TIME_SECONDS"] == "30"
        assert env["HPCRING_STALL_SHUTDOWN_TIME_SECONDS"] == "90"
        assert env["HPCRING_STALL_CHECK_DISABLE"] == "1"
        assert env["HPCRING_ALLREDUCE_ALGORITHM"] == "ring"
        assert env["HPCRING_LOG_LEVEL"] == "debug"


INIT_ENV = """
import json, os, hpcring
topo = hpcring.init()
names = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME"]
horovod = [os.environ.get("HOROVOD_" + n) for n in names]
print(json.dumps([topo.rank, horovod, os.environ.get("HPCRING_RANK")]))
"""


@pytest.mark.parametrize("np", [1, 2, 4])
def test_init_under_a_plain_mpiexec_sets_horovods_variables_too(np: int) -> None:
    """Started by mpiexec itself (as srun or jsrun would), init() fills in the same rank variables."""
    rank_names = (
        "HPCRING_",
        "HOROVOD_",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_",
        "MASTER_",
        "OMPI_",
        "PMIX_",
        "PRTE_",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(rank_names)}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(ROOT))
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    argv = [mpiexec, "-n", str(np), "--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "none"]
    proc = subprocess.run(
        ["timeout", "-k", "5", "120", *argv, sys.executable, "-c", INIT_ENV],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = sorted(json.loads(line) for line in proc.stdout.splitlines())
    host = socket.gethostname()
    assert got == [[r, [str(r), str(np), str(r), str(np), "0", "1", host], str(r)] for r in range(np)]


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_mpi_program_runs_under_the_wrapper(hpcring_run: RunRanks, flavour: str) -> None:
    """The wrapper must not initialise MPI itself, and the user's program must reach the MPI launcher."""
    proc = hpcring_run(2, ["{python}", PROGRAM, "mpi"], flavour=flavour)
    assert proc.returncode == 0, proc.stderr
    out = prefixed(proc.stdout, "stdout")
    assert out == {0: ["mpi rank=0 size=2 sum=3"], 1: ["mpi rank=1 size=2 sum=3"]}


def test_lines_are_never_interleaved_and_no_prefix(hpcring_run: RunRanks) -> None:
    count, length = 400, 3000  # each line larger than a pipe write, so a naive relay would split it
    proc = hpcring_run(4, ["{python}", PROGRAM, "lines", str(count), str(length)])
    assert proc.returncode == 0, proc.stderr
    out = prefixed(proc.stdout, "stdout")
    for r in range(4):
        letter = chr(ord("a") + r)
        assert out[r] == [f"r{r}i{i}:" + letter * length for i in range(count)]
    plain = hpcring_run(2, ["{python}", PROGRAM, "lines", "3", "5"], extra=["--no-prefix"])
    assert plain.returncode == 0, plain.stderr
    assert sorted(plain.stdout.splitlines()) == sorted(
        f"r{r}i{i}:" + chr(97 + r) * 5 for r in (0, 1) for i in range(3)
    )


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def assert_no_orphans(directory: Path, np: int, extra: Sequence[int] = (), within: float = 5) -> None:
    """Every pid the ranks recorded (their own and a grandchild's), plus `extra`, is gone within `within`."""
    pids = [int(p) for f in directory.glob("*.pids") for p in f.read_text().split()]
    assert len(pids) == 2 * np, f"expected every rank to record 2 pids, got {pids}"
    pids += extra
    deadline = time.monotonic() + within  # the kernel reaps asynchronously
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes outlived the job"


@pytest.mark.parametrize(
    ("flavour", "np", "how", "code", "message"),
    [
        ("openmpi", 4, "3", 3, "rank 2 exited with code 3"),
        ("openmpi", 2, "kill", 137, "rank 1 was killed by signal 9 (SIGKILL)"),
        ("mpich", 2, "5", 5, "rank 1 exited with code 5"),
    ],
)
def test_failing_rank_ends_the_job(
    hpcring_run: RunRanks, tmp_path: Path, flavour: str, np: int, how: str, code: int, message: str
) -> None:
    failing = int(message.split()[1])
    start = time.monotonic()
    proc = hpcring_run(np, ["{python}", PROGRAM, "fail", str(tmp_path), str(failing), how], flavour=flavour)
    wall = time.monotonic() - start
    assert proc.returncode == code, proc.stderr
    assert f"hpcring run: {message}" in proc.stderr
    assert "improperly" not in proc.stderr  # Open MPI's help text about ranks we ended is not shown
    assert sorted(prefixed(proc.stdout, "stdout")) == list(range(np))
    assert wall < 60, f"the job took {wall:.1f} s to end after a rank failed (hang guard; target < 10 s)"
    assert_no_orphans(tmp_path, np)


@pytest.mark.parametrize(
    ("flavour", "how", "code"), [("openmpi", "raise", 1), ("mpich", "raise", 1), ("openmpi", "4", 4)]
)
def test_rank_failing_after_mpi_init_does_not_hang(
    hpcring_run: RunRanks, flavour: str, how: str, code: int
) -> None:
    """A Python rank that raises or exits non-zero after MPI_Init while the others wait in a collective."""
    start = time.monotonic()
    proc = hpcring_run(3, ["{python}", PROGRAM, "mpi-fail", how, "1"], flavour=flavour, timeout=120)
    wall = time.monotonic() - start
    assert proc.returncode == code, proc.stderr
    assert f"hpcring run: rank 1 exited with code {code}" in proc.stderr
    if how == "raise":
        assert "hpcring run: rank 1 exited with code 1 (ValueError: rank 1 fails on purpose)" in proc.stderr
        traceback = prefixed(proc.stderr, "stderr")[1]
        assert traceback[0] == "Traceback (most recent call last):"
        assert traceback[-1] == "ValueError: rank 1 fails on purpose"
        # the user's frames, whole; none of the launcher's (hpcring.launch.pyrun, runpy)
        frames = [line for line in traceback if line.startswith("  File ")]
        assert [f.rsplit(", in ", 1)[1] for f in frames] == ["<module>", "main"], traceback
        assert all(PROGRAM in f for f in frames) and "pyrun" not in proc.stderr and "runpy" not in proc.stderr
    assert "improperly" not in proc.stderr and "BAD TERMINATION" not in proc.stderr
    assert wall < 60, f"{wall:.1f} s (hang guard)"


def test_no_fail_fast_leaves_python_commands_alone(hpcring_run: RunRanks) -> None:
    proc = hpcring_run(
        1,
        [
            "{python}",
            "-c",
            "import sys; print(sys.argv, sys.modules['__main__'].__file__ if "
            "hasattr(sys.modules['__main__'], '__file__') else None)",
        ],
        extra=["--no-fail-fast"],
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0]<stdout>:['-c'] None"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_signal_to_launcher_ends_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C / SIGTERM end the job cleanly; even SIGKILL (no clean-up possible) leaves no process behind."""
    np = 2
    argv = [sys.executable, "-m", "hpcring", "run", "-np", str(np), "--", sys.executable, PROGRAM, "wait"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        ["timeout", "-k", "5", "120", *argv, str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready = 0
    for line in proc.stdout:
        ready += line.endswith("ready\n")
        if ready == np:
            break
    assert ready == np
    launcher = [p for p in _children(proc.pid) if b"hpcring" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert launcher, "launcher process not found under timeout"
    mpiexec = _children(launcher[0])
    start = time.monotonic()
    os.kill(launcher[0], sig)
    _, err = proc.communicate(timeout=60)
    wall = time.monotonic() - start
    # `timeout` re-raises a child's fatal signal on itself; SIGKILL can only be seen that way.
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig), err
    if sig != signal.SIGKILL:
        assert f"received {sig.name}; ending all ranks" in err
        assert wall < 30
    assert_no_orphans(tmp_path, np, extra=mpiexec, within=20)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def run_cli(
    *args: str, env: dict[str, str] | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["timeout", "-k", "5", "120", python, "-m", "hpcring", "run", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-np", "0", "--", "true"], "-np must be at least 1"),
        (["-np", "-3", "--", "true"], "-np must be at least 1"),
        (["-np", "two", "--", "true"], "-np 'two' is not a whole number"),
        (["--", "true"], "-np N is required"),
        (["-np", "2"], "no command to run"),
        (
            ["-np", "2", "--mpi", "lam", "--", "true"],
            "--mpi 'lam' is not supported; allowed: 'openmpi' or 'mpich'",
        ),
        (["-np", "2", "--mpi", "mpich", "--", "true"], "the installed MPI is openmpi"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "--", "true"], "cannot be read"),
        (["-np", "5", "-H", "nodeA:2,nodeB:2", "--", "true"], "-np 5 is more than the 4 slots"),
        (["-np", "2", "-H", "nodeA:x", "--", "true"], "slot count 'x' is not an integer"),
        (["-np", "2", "-H", "a:1,a:1", "--", "true"], "listed twice"),
        (
            ["-np", "2", "--emulate-nodes", "3", "--", "true"],
            "--emulate-nodes 3 must be between 1 and -np (2)",
        ),
        (
            ["-np", "2", "--allreduce-algorithm", "tree", "--", "true"],
            "allowed: 'auto', 'native', 'ring', 'hierarchical' or 'shm'",
        ),
        (["-np", "2", "-H", "a:2", "--hostfile", "f", "--", "true"], "not both"),
        (["-np", "2", "--rsh-agent", "/nonexistent", "--", "true"], "is not an executable file"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr


def test_bad_hostfile_lines(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnodeA slots=2\nnodeB slots=two\n")
    proc = run_cli("-np", "2", "--hostfile", str(hostfile), "--", "true")
    assert proc.returncode == 2
    assert f"hostfile '{hostfile}' line 3: slot count 'two' is not an integer" in proc.stderr


def test_flags_from_environment() -> None:
    """Every flag has an HPCRING_* twin: -np, --mpi and --emulate-nodes here come from the environment."""
    proc = run_cli("--dry-run", "--", "prog", env={"HPCRING_NP": "3", "HPCRING_MPI": "openmpi"})
    assert proc.returncode == 0, proc.stderr
    assert (
        " -n 3 " in proc.stdout
        and "--bind-to none" in proc.stdout
        and proc.stdout.rstrip().endswith("-- prog")
    )
    bad = run_cli("--", "prog", env={"HPCRING_NP": "3", "HPCRING_EMULATE_NODES": "9"})
    assert bad.returncode == 2 and "--emulate-nodes 9" in bad.stderr


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["{python}", "no_such_script.py", "--lr", "1"], "python script 'no_such_script.py' does not exist"),
        (["{python}", "-u", "-m", "no_such_module.sub"], "python -m no_such_module.sub: no module named"),
        (["{python}", "-m", "json.no_such"], "python -m json.no_such: no module named 'json.no_such'"),
        (["{python}", "-m", "hpcring.launch"], "'hpcring.launch' is a package without a __main__ module"),
        (["/nonexistent/program"], "program '/nonexistent/program' does not exist"),
        (
            ["./tests/launch/rank_program.py", "env"],
            "program './tests/launch/rank_program.py' is not executable",
        ),
        (["no-such-program-on-path"], "program 'no-such-program-on-path' is not on PATH"),
    ],
)
def test_a_missing_target_is_refused_before_anything_starts(command: list[str], message: str) -> None:
    """One line naming what is missing and exit 2; no startup line, no rank: nothing was launched."""
    proc = run_cli("-np", "2", "--", *[sys.executable if c == "{python}" else c for c in command])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hpcring run: error: ") and message in proc.stderr
    assert proc.stderr.rstrip().endswith("nothing was launched") and len(proc.stderr.splitlines()) == 1
    assert proc.stdout == ""


def test_an_elastic_job_checks_its_target_too() -> None:
    proc = run_cli("--min-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--", sys.executable, "gone.py")
    assert proc.returncode == 2, proc.stderr
    assert "python script 'gone.py' does not exist" in proc.stderr and "world 0" not in proc.stderr


def test_mpich_environment_is_detected() -> None:
    py = flavour_python("mpich")
    proc = run_cli("-np", "2", "--mpi", "openmpi", "--", "true", python=py)
    assert proc.returncode == 2
    assert "the installed MPI is mpich" in proc.stderr


@pytest.mark.parametrize(("flag", "env"), [(["--quiet"], {}), ([], {"HPCRING_QUIET": "1"}), ([], {})])
def test_the_startup_line_and_its_quiet_switch(flag: list[str], env: dict[str, str]) -> None:
    proc = run_cli("-np", "2", *flag, "--", "true", env=env)
    assert proc.returncode == 0, proc.stderr
    startup = [line for line in proc.stderr.splitlines() if line.startswith("hpcring run: 2 ranks on ")]
    assert len(startup) == (0 if flag or env else 1), proc.stderr
