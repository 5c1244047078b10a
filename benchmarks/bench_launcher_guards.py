"""What the launcher's guards of issue 35 cost, paired with a checkout without them.

    python benchmarks/bench_launcher_guards.py --new . --old /path/to/older/checkout --pairs 4

The guards: the control port's authentication and bounds, the per-job directories, the wrappers' tracking
of their rank's shared memory (reads of /proc/PID/maps, ever less often) and their sweep at the end, the
launcher's check that its own loop ran on time. For each of `--pairs` rounds, alternating which goes first,
each checkout (`PYTHONPATH`) runs:

- `hpcring run -np 2 benchmarks/bench_torch_latency.py`: the 4-byte `hvd.allreduce_` median and quiet-window
  median on rank 0 (µs), and the launcher's peak RSS (VmHWM, sampled until it exits);
- an idle 2-rank job while a neighbour opens 4 connections that each announce a 63 MiB frame and send it:
  the launcher's RSS before and after (what issue 35 found: 21.6 -> 280.6 MB without the guards).

Prints one JSON line per run and, at the end, the medians and the paired ratios new / old. Needs no GPU.
The jobs run in a temporary directory, so which `hpcring` they use is PYTHONPATH's choice alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOD_FRAME_BYTES = 63 << 20


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def launch(tree: str, command: list[str], workdir: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "hpcring", "run", "-np", "2", "--", sys.executable, *command]
    return subprocess.Popen(
        argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def latency(tree: str, workdir: str, ops: int) -> dict[str, float]:
    out = Path(workdir, "lat.json")
    out.unlink(missing_ok=True)
    script = str(HERE / "bench_torch_latency.py")
    proc = launch(tree, [script, "--ops", str(ops), "--json", str(out)], workdir)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, status_kib(proc.pid, "VmHWM") or 0)
        time.sleep(0.1)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"latency run failed ({proc.returncode}): {err[-2000:]}")
    result = json.loads(out.read_text())
    return {
        "allreduce_us": result["us"]["allreduce_"],
        "quiet_us": result["quiet_us"]["allreduce_"],
        "launcher_peak_mib": peak / 1024,
    }


def control_port(launcher: int) -> int:
    for pid in children(launcher):
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--control" in words:
            return int(words[words.index(b"--control") + 1].decode().rpartition(":")[2])
    raise SystemExit("no --control on mpiexec's command line")


def flood_memory(tree: str, workdir: str) -> dict[str, float]:
    proc = launch(tree, ["-c", "import time; print('up', flush=True); time.sleep(60)"], workdir)
    assert proc.stdout is not None
    ups = 0
    while ups < 2:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"idle job ended early: {proc.communicate()[1][-2000:]}")
        ups += "up" in line
    before = status_kib(proc.pid, "VmRSS") or 0
    port = control_port(proc.pid)
    socks = []
    chunk = b"x" * (1 << 20)
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        try:
            s.sendall(struct.pack(">cI", b"H", FLOOD_FRAME_BYTES - 1))
            for _ in range(FLOOD_FRAME_BYTES // len(chunk) - 1):
                s.sendall(chunk)
        except OSError:
            pass  # dropped by the launcher: what the guard does
        socks.append(s)
    time.sleep(1.0)
    after = status_kib(proc.pid, "VmRSS") or 0
    for s in socks:
        s.close()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    return {"rss_before_mib": before / 1024, "rss_flooded_mib": after / 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", required=True, help="checkout with the guards (its root, for PYTHONPATH)")
    p.add_argument("--old", required=True, help="checkout without them")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--ops", type=int, default=2000)
    args = p.parse_args()
    trees = {"new": str(Path(args.new).resolve()), "old": str(Path(args.old).resolve())}
    results: dict[str, list[dict[str, float]]] = {"new": [], "old": []}
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.pairs):
            order = ["new", "old"] if i % 2 == 0 else ["old", "new"]
            for name in order:
                row = {**latency(trees[name], workdir, args.ops), **flood_memory(trees[name], workdir)}
                results[name].append(row)
                print(json.dumps({"pair": i, "code": name, **row}), flush=True)
    for key in results["new"][0]:
        new = [r[key] for r in results["new"]]
        old = [r[key] for r in results["old"]]
        ratios = [n / o for n, o in zip(new, old, strict=True) if o]
        print(
            f"{key}: new {statistics.median(new):.1f}, old {statistics.median(old):.1f}, "
            f"paired new/old median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
