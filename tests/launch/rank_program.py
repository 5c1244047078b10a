"""Program that each rank runs in the launcher tests: `python rank_program.py MODE [args]`.

Modes: `env` prints this rank's launcher variables as JSON; `lines N LEN` prints N long lines fast (to catch
interleaving); `mpi` does a real MPI allreduce; `fail DIR RANK HOW` records pids (its own and a grandchild's)
in DIR, then the given rank fails (HOW = exit code, or `kill` for SIGKILL) while the others wait to be ended;
`wait DIR` records pids and waits (for signals sent to the launcher); `tick DIR` records pids, then
prints `tick N` every 0.1 s, each also appended to DIR/RANK.ticks once printed (what the launcher must
show); `shm DIR HOW` initialises MPI, records pids and the shared-memory files it maps (DIR/RANK.maps),
then ends as HOW says (`ok`: after a barrier; `fail`: rank 1 exits 3; `wait`: sleeps); `mpi-fail HOW RANK`
makes RANK raise (HOW = raise) or sys.exit(HOW) after MPI_Init while the others wait in a barrier.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

KEYS = [
    "HPCRING_RANK",
    "HPCRING_SIZE",
    "HPCRING_LOCAL_RANK",
    "HPCRING_LOCAL_SIZE",
    "HPCRING_CROSS_RANK",
    "HPCRING_CROSS_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HPCRING_EMULATE_NODES",
    "HPCRING_FUSION_THRESHOLD",
    "HPCRING_CYCLE_TIME",
    "HPCRING_CACHE_CAPACITY",
    "HPCRING_TIMELINE",
    "HPCRING_TIMELINE_MARK_CYCLES",
    "HPCRING_STALL_CHECK_TIME_SECONDS",
    "HPCRING_STALL_SHUTDOWN_TIME_SECONDS",
    "HPCRING_STALL_CHECK_DISABLE",
    "HPCRING_ALLREDUCE_ALGORITHM",
    "HPCRING_LOG_LEVEL",
]


def record_pids(directory: str) -> None:
    """Write our pid and a grandchild's (a sleeping subprocess) so the test can check none survives."""
    child = subprocess.Popen(["sleep", "300"])
    rank = os.environ["HPCRING_RANK"]
    Path(directory, f"{rank}.pids").write_text(f"{os.getpid()} {child.pid}\n")


def shm_mode(directory: str, how: str, rank: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    comm.allreduce(rank)  # every transport set up
    record_pids(directory)
    lines = Path("/proc/self/maps").read_text().splitlines()
    maps = {line.split()[5] for line in lines if len(line.split()) == 6}
    mine = sorted(p for p in maps if p.startswith(("/dev/shm/", os.environ.get("TMPDIR", "/tmp"))))
    Path(directory, f"{rank}.maps").write_text("".join(f"{p}\n" for p in mine))
    print("ready", flush=True)
    if how == "ok":
        comm.Barrier()
        return
    if how == "fail" and rank == 1:
        time.sleep(0.5)
        os._exit(3)
    time.sleep(300)


def main() -> None:
    mode = sys.argv[1]
    rank = int(os.environ["HPCRING_RANK"])
    if mode == "env":
        print(json.dumps({k: os.environ.get(k) for k in KEYS}))
        print(f"rank {rank} on stderr", file=sys.stderr)
    elif mode == "lines":
        count, length = int(sys.argv[2]), int(sys.argv[3])
        for i in range(count):
            sys.stdout.write(f"r{rank}i{i}:" + chr(ord("a") + rank % 26) * length + "\n")
        sys.stdout.flush()
    elif mode == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        total = comm.allreduce(comm.Get_rank() + 1)
        print(f"mpi rank={comm.Get_rank()} size={comm.Get_size()} sum={total}", flush=True)
    elif mode == "mpi-fail":
        # A rank fails after MPI_Init while the others wait for it in a collective: without fail-fast, its
        # MPI_Finalize at exit would wait for them and the job would hang.
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        comm.Barrier()
        if comm.Get_rank() == int(sys.argv[3]):
            if sys.argv[2] == "raise":
                raise ValueError(f"rank {comm.Get_rank()} fails on purpose")
            sys.exit(int(sys.argv[2]))
        comm.Barrier()
    elif mode == "fail":
        directory, failing, how = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        record_pids(directory)
        print("ready", flush=True)
        if rank == failing:
            time.sleep(0.5)  # let the others start waiting
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(int(how))
        time.sleep(300)
    elif mode == "tick":
        record_pids(sys.argv[2])
        print("ready", flush=True)
        with open(Path(sys.argv[2], f"{rank}.ticks"), "a") as log:
            for i in range(3000):
                print(f"tick {i}", flush=True)
                log.write(f"tick {i}\n")
                log.flush()
                time.sleep(0.1)
    elif mode == "shm":
        shm_mode(sys.argv[2], sys.argv[3], rank)
    elif mode == "wait":
        record_pids(sys.argv[2])
        print("ready", flush=True)
        time.sleep(300)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
