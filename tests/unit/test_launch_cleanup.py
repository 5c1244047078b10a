"""The clean-up helpers of issue 35 without a job: which files a rank's wrapper may remove, and when."""

from __future__ import annotations

import mmap
import os
import socket
from pathlib import Path

from hpcring.launch import cleanup


def test_the_rank_gets_the_users_tmpdir_back() -> None:
    env = {"TMPDIR": "/job", cleanup.USER_TMPDIR: "/home/me/tmp", cleanup.JOB_DIRS: "/job", "X": "1"}
    cleanup.rank_environment(env)
    assert env == {"TMPDIR": "/home/me/tmp", "X": "1"}
    env = {"TMPDIR": "/job", cleanup.USER_TMPDIR: ""}
    cleanup.rank_environment(env)
    assert env == {}


def test_job_dirs_are_removed_only_by_name_and_on_their_host(tmp_path: Path) -> None:
    ours, other = tmp_path / f"{cleanup.JOB_PREFIX}abc", tmp_path / "precious"
    ours.mkdir()
    other.mkdir()
    dirs = os.pathsep.join([str(ours), str(other)])
    assert cleanup.remove_job_dirs({cleanup.JOB_DIRS: dirs, cleanup.JOB_HOST: "elsewhere"}) == []
    assert ours.exists()
    host = socket.gethostname()
    assert cleanup.remove_job_dirs({cleanup.JOB_DIRS: dirs, cleanup.JOB_HOST: host}) == [str(ours)]
    assert not ours.exists() and other.exists()


def test_only_transient_mpi_files_are_tracked_and_swept(tmp_path: Path) -> None:
    """A rank may map a user's own file in /dev/shm: only MPI's and hpcring's names are candidates."""
    paths = [tmp_path / "mpich_shm_test_0", tmp_path / "users-dataset"]
    maps = []
    for path in paths:
        path.write_bytes(b"\0" * 4096)
        with open(path, "r+b") as f:
            maps.append(mmap.mmap(f.fileno(), 4096))
    tracker = cleanup.ShmTracker({"HPCRING_SHM_DIR": str(tmp_path)})
    tracker.sample(os.getpid(), 0.0)
    assert tracker.seen == {str(paths[0])}
    for m in maps:
        m.close()
    assert tracker.sweep(None) == [str(paths[0])]
    assert not paths[0].exists() and paths[1].exists()
