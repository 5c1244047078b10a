"""Elastic training end to end: real `hpcring run` elastic driver, real mpiexec, real SIGKILLs.

Hosts are loopback names (127.0.0.1, 127.0.0.2, ...): each is a distinct host to the driver (it blacklists
them one by one) while every rank runs on this machine. Every launch is under `timeout`; each test checks
several things about its launches, since launches are the expensive part on 2 cores.
"""

from __future__ import annotations

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
import torch
from support import ROOT

PROGRAM = str(Path(__file__).with_name("train_program.py"))
BROKEN = str(Path(__file__).with_name("broken_program.py"))
WORLD = re.compile(
    r"^\[(\d+)\]<stdout>:WORLD gen=(\d+) size=(\d+) rank=\d+ step=(\d+) epoch=\d+ wsum=(\S+) t=(\S+)$"
)
STEP = re.compile(r"^\[(\d+)\]<stdout>:STEP (\d+) size=(\d+) t=(\S+)$")
KILL = re.compile(r"^\[(\d+)\]<stdout>:KILL rank=\d+ step=(\d+) t=(\S+)$")
HVDENV = re.compile(
    r"^\[(\d+)\]<stdout>:HVDENV gen=(\d+) hvd=(\S+) RANK=(\S+) SIZE=(\S+) LOCAL_RANK=(\S+) LOCAL_SIZE=(\S+) "
    r"CROSS_RANK=(\S+) CROSS_SIZE=(\S+) HOSTNAME=(\S+)$"
)
END = re.compile(r"^\[(\d+)\]<stdout>:END (\w+) size=(\d+) rank=\d+ step=(\d+) wsum=(\S+)$")


def hosts(n: int) -> str:
    return ",".join(f"127.0.0.{i + 1}:1" for i in range(n))


def launch(
    flags: Sequence[str],
    program_args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: int = 240,
    program: str = PROGRAM,
) -> subprocess.CompletedProcess[str]:
    """`hpcring run FLAGS -- python train_program.py ARGS` under timeout (never hangs)."""
    py = sys.executable
    argv = [py, "-m", "hpcring", "run", *flags, "--", py, "-W", "ignore", program, *program_args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full_env.pop("HPCRING_ELASTIC_DIR", None)  # the driver's own store unless the test names one
    full_env.update(env or {})
    return subprocess.run(
        ["timeout", "-k", "5", str(timeout), *argv],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
    )


def matches(pattern: re.Pattern[str], text: str) -> list[tuple[str, ...]]:
    return [m.groups() for line in text.splitlines() if (m := pattern.match(line))]


def no_orphans(marker: str) -> None:
    """No process of this test's job is left (the marker is a path only this test's commands carry)."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "", f"processes left behind: {out.stdout}"


def recovery_s(out: str) -> float:
    """Seconds from the SIGKILL to the first step completed by the next world."""
    (_, _, killed_at), *_ = matches(KILL, out)
    resumed_at = min(float(t) for _, g, _, _, _, t in matches(WORLD, out) if g == "1")
    after = [float(t) for _, _, _, t in matches(STEP, out) if float(t) > resumed_at]
    return min(after) - float(killed_at)


@pytest.mark.parametrize("np", [2, 3, 4])
def test_a_killed_rank_shrinks_the_world_and_training_matches_the_same_schedule(
    tmp_path: Path, np: int
) -> None:
    """kill -9 of one rank after step 5 (last commit: step 4): the others go on at np-1 from step 4 and
    finish; the final weights equal those of a run that trains steps 1-4 at np and the rest at np-1 with no
    failure (same seeds, ElasticSampler, the same commit/restore path)."""
    final = tmp_path / "elastic.pt"
    res = launch(
        ["-H", hosts(np), "--min-np", str(np - 1), "--reset-limit", "1"],
        ["--kill-rank", "1", "--kill-step", "5", "--out", str(final)],
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err[-3000:]
    worlds = {(int(g), int(s), int(step)) for _, g, s, step, _, _ in matches(WORLD, out)}
    assert worlds == {(0, np, 0), (1, np - 1, 4)}, worlds
    assert "rank 1 was killed by signal 9 (SIGKILL)" in err
    assert "host 127.0.0.2 (rank 1" in err and "blacklisted for good" in err
    ends = matches(END, out)
    assert len(ends) == np - 1 and {e[2] for e in ends} == {str(np - 1)} and len({e[4] for e in ends}) == 1
    # Horovod's rank variables follow the world: each world's own rank, size and host (the driver's name for
    # it); every "host" is this machine, so local = world and one cross group, as hvd reports too.
    hosts_of = {
        0: [f"127.0.0.{i + 1}" for i in range(np)],
        1: [f"127.0.0.{i + 1}" for i in range(np) if i != 1],
    }
    seen = set()
    for label, g, place, *horovod in matches(HVDENV, out):
        r, size = int(label), len(hosts_of[int(g)])
        want = [str(v) for v in (r, size, r, size, 0, 1)]
        assert horovod == [*want, hosts_of[int(g)][r]], (g, label, horovod)
        assert place.split(",") == want
        seen.add((int(g), r))
    assert seen == {(0, r) for r in range(np)} | {(1, r) for r in range(np - 1)}
    rec = recovery_s(out)
    print(f"recovery at {np} -> {np - 1} ranks: {rec:.2f} s (SIGKILL -> first step of the next world)")
    no_orphans(str(final))

    # The same schedule of sizes without a failure: steps 1-4 at np ranks, then np-1 from that commit.
    commits = tmp_path / "commits"
    reference = tmp_path / "reference.pt"
    env = {"HPCRING_ELASTIC_DIR": str(commits)}
    first = launch(["-np", str(np)], ["--stop-after", "4"], env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    second = launch(["-np", str(np - 1)], ["--out", str(reference)], env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {(int(s), int(step)) for _, _, s, step, _, _ in matches(WORLD, second.stdout)} == {(np - 1, 4)}
    got, want = torch.load(final), torch.load(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_a_frozen_rank_is_ended_its_host_dropped_and_training_goes_on(tmp_path: Path) -> None:
    """SIGSTOP of rank 1 after step 5 (last commit: step 4), collective timeout 3 s: its wrapper ends it at
    half the timeout, before any survivor's watchdog fires, and names it; the driver takes it for a lost
    host (blacklisted, as a cut-off node is: issue 27) and re-forms the world on the two hosts left from
    step 4, and training finishes."""
    final = tmp_path / "frozen.pt"
    res = launch(
        ["-H", hosts(3), "--min-np", "2", "--reset-limit", "1"],
        ["--kill-rank", "1", "--kill-step", "5", "--freeze", "--out", str(final)],
        env={"HPCRING_COLLECTIVE_TIMEOUT": "3"},
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err[-3000:]
    worlds = {(int(g), int(s), int(step)) for _, g, s, step, _, _ in matches(WORLD, out)}
    assert worlds == {(0, 3, 0), (1, 2, 4)}, worlds
    assert "rank 1 on vm was stopped (SIGSTOP) for 1.5 s".replace("vm", socket.gethostname()) in err, err[
        -3000:
    ]
    assert "host 127.0.0.2 (rank 1" in err and "blacklisted" in err, err[-3000:]
    ends = matches(END, out)
    assert len(ends) == 2 and len({e[4] for e in ends}) == 1
    no_orphans(str(final))


def test_discovery_adds_a_host_and_the_new_worker_gets_the_state(tmp_path: Path) -> None:
    """Discovery starts with 2 hosts; at step 3 a third appears: the driver announces it, the workers save at
    their next commit and leave, and the next world trains at size 3 from that state (the new rank's weights
    equal the others'), to the end."""
    listing = tmp_path / "hosts.txt"
    listing.write_text("127.0.0.1:1\n127.0.0.2:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    script.chmod(0o755)
    res = launch(
        ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script)],
        [
            "--grow-file",
            str(listing),
            "--grow-step",
            "3",
            "--grow-host",
            "127.0.0.3:1",
            "--step-sleep",
            "0.4",
        ],
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err[-3000:]
    assert "hosts changed (+127.0.0.3)" in err
    worlds = matches(WORLD, out)
    sizes = sorted({(int(g), int(s)) for _, g, s, _, _, _ in worlds})
    assert sizes == [(0, 2), (1, 3)], sizes
    resumed = [w for w in worlds if w[1] == "1"]
    assert len(resumed) == 3 and len({w[3] for w in resumed}) == 1 and len({w[4] for w in resumed}) == 1
    assert int(resumed[0][3]) >= 4 and int(resumed[0][3]) % 2 == 0  # the commit the workers left at
    ends = matches(END, out)
    assert len(ends) == 3 and {e[2] for e in ends} == {"3"} and len({e[4] for e in ends}) == 1
    no_orphans(str(listing))


def test_discovery_removes_a_host_and_the_world_shrinks_without_losing_work(tmp_path: Path) -> None:
    """A host leaves the discovery output at step 3 (a scale-down, not a failure): the workers save their
    current state at the next commit, nothing is blacklisted, and training goes on at size 2 from there."""
    listing = tmp_path / "hosts.txt"
    listing.write_text("127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    script.chmod(0o755)
    res = launch(
        ["--min-np", "2", "--host-discovery-script", str(script), "--reset-limit", "1"],
        ["--grow-file", str(listing), "--grow-step", "3", "--drop-host", "127.0.0.3", "--step-sleep", "0.4"],
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err[-3000:]
    assert "hosts changed (-127.0.0.3)" in err and "blacklisted" not in err
    worlds = matches(WORLD, out)
    assert sorted({(int(g), int(s)) for _, g, s, _, _, _ in worlds}) == [(0, 3), (1, 2)]
    resumed = {int(w[3]) for w in worlds if w[1] == "1"}
    assert len(resumed) == 1 and min(resumed) >= 4  # the step the workers saved at, not an older commit
    ends = matches(END, out)
    assert len(ends) == 2 and {e[2] for e in ends} == {"2"} and len({e[4] for e in ends}) == 1
    no_orphans(str(listing))


def test_failures_beyond_the_reset_limit_end_the_job(tmp_path: Path) -> None:
    """Rank 1 dies in every world; --reset-limit 1 allows one relaunch: the second failure ends the job
    with the failing rank's status and a line naming the limit, and leaves no process behind."""
    marker = tmp_path / "marker.pt"
    res = launch(
        ["-H", hosts(4), "--min-np", "2", "--reset-limit", "1"],
        ["--kill-rank", "1", "--kill-step", "3", "--kill-worlds", "0,1,2", "--out", str(marker)],
    )
    assert res.returncode == 128 + 9, res.stderr[-3000:]
    assert "--reset-limit 1 reached" in res.stderr
    assert res.stderr.count("hpcring run: rank 1 was killed by signal 9") == 2
    no_orphans(str(marker))


def test_below_min_np_for_longer_than_the_elastic_timeout_ends_the_job(tmp_path: Path) -> None:
    """Two hosts, --min-np 2: after one is blacklisted (with a cooldown longer than the timeout) only one slot
    is left; the driver says what it waits for, waits --elastic-timeout seconds, then ends the job with a
    line that says so."""
    marker = tmp_path / "marker.pt"
    res = launch(
        ["-H", hosts(2), "--min-np", "2", "--elastic-timeout", "2", "--blacklist-cooldown-range", "60", "60"],
        ["--kill-rank", "1", "--kill-step", "3", "--out", str(marker)],
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert "waiting for blacklisted hosts to come back after their cooldown" in res.stderr
    assert "fewer than --min-np 2 for 2 s (--elastic-timeout); ending the job" in res.stderr
    assert re.search(r"blacklisted: 127\.0\.0\.2 for \d+ s", res.stderr), res.stderr[-2000:]
    no_orphans(str(marker))


def test_a_static_host_list_with_no_slot_left_ends_at_once(tmp_path: Path) -> None:
    """Two hosts of a host list, no discovery script, no cooldown: once the failed rank's host is
    blacklisted for good no wait can give --min-np 2 slots, so the job ends at once (not after the
    --elastic-timeout of 600 s) with the failed rank's status and the blacklist."""
    marker = tmp_path / "marker.pt"
    start = time.monotonic()
    res = launch(
        ["-H", hosts(2), "--min-np", "2", "--elastic-timeout", "600"],
        ["--kill-rank", "1", "--kill-step", "3", "--out", str(marker)],
    )
    assert time.monotonic() - start < 200, "the job waited instead of ending (hang guard)"
    assert res.returncode == 128 + 9, res.stderr[-3000:]
    assert "hpcring run: rank 1 was killed by signal 9" in res.stderr
    assert (
        "no slot can come back (host list without a discovery script; blacklisted: 127.0.0.2 for good)"
        in (res.stderr)
    )
    assert "waiting up to" not in res.stderr and "world 1" not in res.stderr
    no_orphans(str(marker))


def test_with_a_discovery_script_the_driver_waits_and_says_for_what(tmp_path: Path) -> None:
    """A discovery script reporting one slot for --min-np 2: the driver waits (more may come), its line
    says so, and the --elastic-timeout ends the job."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1:1\n")
    script.chmod(0o755)
    res = launch(
        ["--min-np", "2", "--host-discovery-script", str(script), "--elastic-timeout", "1"],
        ["--out", str(tmp_path / "never.pt")],
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert (
        "waiting up to 1 s for --min-np 2 slots (have 1: 127.0.0.1:1; blacklisted: none): waiting for the "
        "host discovery script to report more"
    ) in res.stderr
    assert "fewer than --min-np 2 for 1 s (--elastic-timeout); ending the job" in res.stderr


def test_a_blacklisted_host_comes_back_after_its_cooldown(tmp_path: Path) -> None:
    """With --blacklist-cooldown-range the failed host is out for a while, then the next world uses it
    again: two hosts, --min-np 2, the relaunch waits for the cooldown and runs at size 2."""
    marker = tmp_path / "marker.pt"
    res = launch(
        ["-H", hosts(2), "--min-np", "2", "--blacklist-cooldown-range", "1", "3", "--elastic-timeout", "30"],
        ["--kill-rank", "1", "--kill-step", "3", "--out", str(marker)],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"host 127\.0\.0\.2 \(rank 1.*blacklisted for [1-9] s", res.stderr), res.stderr[-2000:]
    assert {(int(g), int(s)) for _, g, s, _, _, _ in matches(WORLD, res.stdout)} == {(0, 2), (1, 2)}
    no_orphans(str(marker))


def test_a_signal_while_waiting_for_hosts_ends_the_job_at_once(tmp_path: Path) -> None:
    """SIGTERM to the launcher between worlds (here: waiting for --min-np slots) ends the job with 128+15."""
    py = sys.executable
    argv = [py, "-m", "hpcring", "run", "-H", hosts(1), "--min-np", "2", "--elastic-timeout", "60"]
    argv += ["--", py, PROGRAM, "--out", str(tmp_path / "never.pt")]
    env = {k: v for k, v in os.environ.items() if k != "HPCRING_ELASTIC_DIR"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert "waiting up to 60 s for --min-np 2 slots (have 1: 127.0.0.1:1; blacklisted: none)" in first, first
    assert "a host list without a discovery script: nothing can add slots" in first, first
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert rc == 128 + signal.SIGTERM
    assert "received SIGTERM; ending the job" in proc.stderr.read()


def test_a_script_that_fails_alike_on_every_rank_ends_the_job_at_once(tmp_path: Path) -> None:
    """The same AttributeError on both ranks before any commit: the script's fault, not the hosts'. The job
    ends with that error shown and the ranks named, within seconds of the failure (it used to blacklist one
    host, then wait the whole --elastic-timeout of 600 s for a second slot), and blacklists nothing."""
    res = launch(["-H", hosts(2), "--min-np", "2"], [], program=BROKEN)
    ended = time.time()
    err = res.stderr
    assert res.returncode == 1, err[-3000:]
    failing = [float(t) for t in re.findall(r"^\[\d\]<stdout>:FAILING rank=\d t=(\S+)$", res.stdout, re.M)]
    assert len(failing) == 2, res.stdout
    print(f"broken script: launcher ended {ended - max(failing):.2f} s after the last rank failed")
    assert ended - min(failing) < 60, "the job did not end at once (hang guard; expected a few seconds)"
    assert "ranks 0, 1 on hosts 127.0.0.1, 127.0.0.2 failed the same way" in err
    assert "the script fails, not a host: ending the job without relaunching" in err
    verdict = err[err.index("failed the same way") :]
    assert "error: AttributeError: 'Tensor' object has no attribute 'nromalize'" in verdict
    assert "in load_batch" in verdict and "in train" in verdict  # one rank's traceback, the user's frames
    assert "pyrun" not in err and "runpy" not in err
    assert "blacklisted" not in err and "world 1" not in err and "relaunching (reset" not in err


def test_an_error_on_one_host_blacklists_it_and_the_job_goes_on(tmp_path: Path) -> None:
    """Rank 1 raises in world 0 before its first commit (the others, waiting in a collective, do not fail
    alike and are ended) and, with another message, in world 1 after a commit (the world ends at once):
    both times one host is blamed, blacklisted, and training goes on to the end on the host left."""
    marker = tmp_path / "marker.pt"
    res = launch(
        ["-H", hosts(3), "--min-np", "1"],
        ["--raise-rank", "1", "--raise-steps", "0:1,1:5", "--out", str(marker)],
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, err[-3000:]
    assert {(int(g), int(s)) for _, g, s, _, _, _ in matches(WORLD, out)} == {(0, 3), (1, 2), (2, 1)}
    lines = err.splitlines()
    first = "hpcring run: rank 1 exited with code 1 (RuntimeError: rank 1 fails in world 0)"
    assert first in lines, err[-3000:]  # alone on its line: the others may still fail alike
    # the others were then ended: by the launcher after the hold, or by mpiexec (rank 1 left MPI unfinalised)
    assert "killed by signal" not in err and "lost contact" not in err  # their ends are not failures
    second = "hpcring run: rank 1 exited with code 1 (RuntimeError: rank 1 fails in world 1)"
    assert f"{second}; ending the other ranks" in lines  # it had committed: no hold
    assert "host 127.0.0.2 (rank 1, which exited with code 1) is blacklisted for good" in err
    assert "host 127.0.0.3 (rank 1, which exited with code 1) is blacklisted for good" in err
    assert "failed the same way" not in err
    ends = matches(END, out)
    assert len(ends) == 1 and ends[0][:3] == ("0", "done", "1")
    no_orphans(str(marker))
