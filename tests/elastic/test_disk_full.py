"""A full disk is a disk error: commits and whole-file writes on a real 64 KiB tmpfs fail with one line naming
the folder and the bytes needed (never a SIGBUS), keep the last good commit, and under the elastic driver end
the job at once with no host blacklisted. Mounting needs root (CI runs as root)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support import ROOT

from hpcring.errors import DISK_FULL_EXIT_STATUS, DiskFullError
from hpcring.files import write_whole
from hpcring.launch.elastic.verdict import Judge, explain
from hpcring.launch.report import DISK, ErrorReport, RankFailure, of_exception
from hpcring.torch.elastic import store

PROGRAM = str(Path(__file__).with_name("disk_program.py"))
SIZE = 64 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted however the test ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(folder)], check=True, timeout=30
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)


def test_a_commit_that_does_not_fit_is_a_disk_error_and_the_last_one_stands(small_fs: Path) -> None:
    commits = store.CommitStore(small_fs, rank=0)
    commits.write(1, {"w": torch.ones(1024)})  # 4 KiB
    good = commits.write(2, {"w": torch.full((1024,), 2.0)})
    big = {"w": torch.zeros(SIZE // 4)}  # 64 KiB of float32: more than the file system holds
    with pytest.raises(DiskFullError) as caught:
        commits.write(3, big)
    err = caught.value
    needed = store.layout(3, big).size
    assert err.errno == errno.ENOSPC and err.directory == str(small_fs) and err.needed == needed
    message = str(err)
    assert "\n" not in message and len(message) < 300
    assert f"in {small_fs}: it needs {needed} bytes and " in message and "bytes are free there" in message
    seq, back = store.read(good)
    assert seq == 2 and torch.equal(back["w"], torch.full((1024,), 2.0))
    assert commits.newest() == (2, good)
    assert sum(p.stat().st_size for p in small_fs.iterdir()) < SIZE // 4  # the failed commit's space is freed
    commits.write(4, {"w": torch.full((1024,), 4.0)})  # and the store works on
    assert commits.newest() is not None and commits.newest()[0] == 4  # type: ignore[index]
    commits.remove_own()


def test_a_whole_file_write_that_does_not_fit_keeps_the_old_file(small_fs: Path) -> None:
    target = small_fs / "checkpoint.pt"
    write_whole(target, b"old")
    with pytest.raises(
        DiskFullError, match=rf"no space left for a checkpoint in {small_fs}: it needs {SIZE} "
    ):
        write_whole(target, bytes(SIZE), what="a checkpoint")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in small_fs.iterdir()) == ["checkpoint.pt"]  # no temporary file left


def test_a_full_disk_is_its_own_kind_and_blames_no_host() -> None:
    report = of_exception(DiskFullError("an elastic commit", "/d", 10, 0, errno.ENOSPC), None)
    assert report.kind == DISK and report.text == ""
    assert of_exception(OSError(errno.EDQUOT, "quota"), None).kind == DISK
    assert of_exception(OSError(errno.EIO, "io"), None).kind == "exception"
    failures = [
        RankFailure(1, "was killed by signal 15 (SIGTERM)", 143),
        RankFailure(0, "exited with code 74", DISK_FULL_EXIT_STATUS, report),
    ]
    verdict = Judge().judge(failures, ["a", "b"], 0)
    assert verdict.script and verdict.host is None and verdict.ranks == (0,) and verdict.hosts == ("a",)
    said = explain(verdict, 0)
    assert said.startswith("rank 0 on a: hpcring.errors.DiskFullError: no space left for an elastic commit")
    assert "no host blacklisted" in said and "\n" not in said
    plain = ErrorReport("exception", "RuntimeError: x", "f.py:1 in g")
    assert not Judge().judge([RankFailure(0, "exited with code 1", 1, plain)], ["a", "b"], 0).script


@pytest.mark.mpi
def test_commits_on_a_full_disk_end_the_elastic_job_without_blacklisting(small_fs: Path) -> None:
    py = sys.executable
    argv = [py, "-m", "hpcring", "run", "-H", "127.0.0.1:1,127.0.0.2:1", "--min-np", "2", "--", py, PROGRAM]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCRING_ELASTIC_DIR": str(small_fs)}
    res = subprocess.run(
        ["timeout", "-k", "5", "120", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    out, err = res.stdout, res.stderr
    assert res.returncode == DISK_FULL_EXIT_STATUS, err[-3000:]
    for r in range(2):  # the state grows at step 3: steps 1 and 2 fit on every rank, step 3 on none
        assert f"[{r}]<stdout>:COMMITTED rank={r} step=2" in out, out
    assert "step=3" not in out
    assert "SIGBUS" not in err and "signal 7" not in err
    full = re.findall(
        r"no space left for an elastic commit \(HPCRING_ELASTIC_DIR\) in (\S+): it needs (\d+)", err
    )
    assert full and all(d == str(small_fs) and int(n) > SIZE for d, n in full), err[-3000:]
    assert "a full disk, not a host's or the script's fault: ending the job without relaunching" in err
    assert "blacklisted for" not in err and "world 1" not in err and "Traceback" not in err
    for r in range(2):  # the last good commit of every rank survives
        assert (
            max(s for p in small_fs.glob(f"rank-{r}.*.commit") if (s := store.peek_seq(p)) is not None) == 2
        )
