"""Stand-in for the `flux` commands hpcring uses, as flux-core's manual pages document them.

- `flux batch [OPTIONS] SCRIPT`: options from the command line and from `# flux:` directive lines (split
  like a shell would), prints the job id in F58 (`ƒ...`) and runs the script in the background inside "its
  own instance" (FLUX_JOB_ID set; hosts node1..nodeN for `-N N`); output in `flux-ID.out` unless `--output`.
  `--signal=SIG@FSD` (flux-batch(1): send SIG that long before the time limit `-t`) signals the script then;
  the time limit itself is not enforced.
- `flux run [-N] [-n] [-c] [-g] [--exclusive] [-o cpu-affinity=..] [-o gpu-affinity=..] COMMAND`: starts
  every task here, tasks spread evenly over the nodes in blocks; per-task affinity gives task i of a node
  cores i*c.. (STANDIN_CPUS, not applied) and GPUs i*g.. (CUDA_VISIBLE_DEVICES), `map:A;B;..` gives task i
  entry i; exits with the highest task status.
- `flux jobs -n -o FORMAT ID`: the job's state (DEPEND..INACTIVE), result and returncode (empty while
  active; minus the signal when killed).
- `flux hostlist -n N instance`: host N of the enclosing instance.

Knobs (environment): STANDIN_STATE, STANDIN_FLUX_PURGE=1 (inactive jobs are purged from the job list at once,
so `flux jobs ID` no longer knows them).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys

import common

F58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
FSD = re.compile(r"^\d+(\.\d+)?[smhd]?$")


def f58(n: int) -> str:
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = F58[r] + out
    return "ƒ" + (out or "1")


class Refuse(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        common.die(f"flux-{self.prog}", message, 1)


def resource_parser(prog: str) -> argparse.ArgumentParser:
    p = Refuse(prog=prog, add_help=False)
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("-n", "--ntasks", type=int, default=1)
    p.add_argument("-c", "--cores-per-task", type=int, default=1)
    p.add_argument("-g", "--gpus-per-task", type=int, default=0)
    p.add_argument("-t", "--time-limit")
    p.add_argument("-q", "--queue")
    p.add_argument("-B", "--bank")
    p.add_argument("--job-name")
    p.add_argument("--exclusive", action="store_true")
    p.add_argument("-S", "--setattr", action="append", default=[])
    p.add_argument("-o", "--setopt", action="append", default=[])
    p.add_argument("--output")
    p.add_argument("--error")
    p.add_argument("--signal")
    return p


def batch(argv: list[str]) -> int:
    p = resource_parser("batch")
    p.add_argument("script")
    cli = p.parse_args(argv)
    words: list[str] = []
    with open(cli.script) as f:
        for line in f:
            if line.startswith("# flux:"):
                words += shlex.split(line[len("# flux:") :])
    args = p.parse_args([*words, *argv])
    if args.time_limit is not None and not FSD.match(args.time_limit):
        common.die("flux-batch", f"invalid Flux standard duration {args.time_limit!r}", 1)
    warning = _warning(args.signal, args.time_limit)
    for attr in args.setattr:
        if "=" not in attr:
            common.die("flux-batch", f"--setattr: {attr!r} is not KEY=VALUE", 1)
    job_id = f58(common.next_seq() * 1_000_003)
    out = args.output or os.path.join(os.getcwd(), f"flux-{job_id}.out")
    common.save_job(
        {
            "id": job_id,
            "state": "SCHED",
            "script": os.path.abspath(cli.script),
            "nodes": args.nodes or 1,
            "workdir": os.getcwd(),
            "out": out,
            "err": args.error,
            "name": args.job_name,
            "warning": warning,
        }
    )
    common.start_background("flux", job_id)
    print(job_id)
    return 0


def _seconds(fsd: str) -> float:
    """A Flux standard duration in seconds ("30", "30s", "2m", "1.5h", "1d")."""
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(fsd[:-1]) * scale[fsd[-1]] if fsd[-1] in scale else float(fsd)


def _warning(spec: str | None, limit: str | None) -> list[float] | None:
    """--signal=SIG@FSD as [signal number, seconds after the start] (None without it)."""
    if spec is None:
        return None
    name, _, before = spec.partition("@")
    sig = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
    if not isinstance(sig, signal.Signals) or not FSD.match(before or "60"):
        common.die("flux-batch", f"--signal: {spec!r} is not SIG@FSD", 1)
    if limit is None:
        common.die("flux-batch", "--signal needs a time limit (-t)", 1)
    return [int(sig), max(0.0, _seconds(limit or "0") - _seconds(before or "60"))]


def run_job(job_id: str) -> None:
    job = common.load_job(job_id)
    assert job is not None
    env = {
        **os.environ,
        "FLUX_JOB_ID": job_id,
        "STANDIN_FLUX_HOSTS": ",".join(f"node{i}" for i in range(1, job["nodes"] + 1)),
    }
    job["state"] = "RUN"
    common.save_job(job)
    warning = job.get("warning")
    rc = common.run_script(
        job["script"], env, job["workdir"], job["out"], job["err"], tuple(warning) if warning else None
    )
    job.update(state="INACTIVE", returncode=rc, result="COMPLETED" if rc == 0 else "FAILED")
    common.save_job(job)


def affinity(value: str, local: int, per_task: int, per_node: int) -> str | None:
    """The set task `local` of a node is bound to (or sees): its share (per-task), the documented `map:` entry
    (entries reused in turn when there are fewer than tasks), all the job's (on), or None (off)."""
    if value == "off":
        return None
    if value == "per-task":
        return common.format_cpus(list(range(local * per_task, (local + 1) * per_task)))
    if value.startswith("map:"):
        entries = value[len("map:") :].split(";")
        return common.format_cpus(common.cpu_list(entries[local % len(entries)]))
    return common.format_cpus(list(range(per_node * per_task)))


def run(argv: list[str]) -> int:
    p = resource_parser("run")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if not args.command:
        common.die("flux-run", "job command and arguments are missing", 1)
    opts = dict(o.split("=", 1) for o in args.setopt)
    for key in ("cpu-affinity", "gpu-affinity"):
        value = opts.get(key, "on")
        if value not in ("on", "off", "per-task") and not value.startswith("map:"):
            common.die("flux-run", f"invalid {key}={value}", 1)
    hosts = os.environ.get("STANDIN_FLUX_HOSTS", "node1").split(",")
    nodes = args.nodes or 1
    if nodes > len(hosts):
        common.die("flux-run", f"unsatisfiable request: {nodes} nodes, the instance has {len(hosts)}", 1)
    per_node = -(-args.ntasks // nodes)
    c, g = args.cores_per_task, args.gpus_per_task
    tasks = []
    for rank in range(args.ntasks):
        node, local = divmod(rank, per_node)
        env = {
            **os.environ,
            "FLUX_TASK_RANK": str(rank),
            "FLUX_TASK_LOCAL_ID": str(local),
            "FLUX_JOB_SIZE": str(args.ntasks),
            "STANDIN_HOST": hosts[node],
        }
        env["STANDIN_CPUS"] = affinity(opts.get("cpu-affinity", "on"), local, c, per_node) or "none"
        if g:
            gpus = affinity(opts.get("gpu-affinity", "on"), local, g, per_node)
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus
        tasks.append((args.command, env))
    return common.run_tasks(tasks)


def jobs(argv: list[str]) -> int:
    p = Refuse(prog="jobs", add_help=False)
    p.add_argument("-n", "--no-header", action="store_true")
    p.add_argument("-o", "--format", default="{id.f58} {state}")
    p.add_argument("ids", nargs="*")
    args = p.parse_args(argv)
    for job_id in args.ids:
        job = common.load_job(job_id)
        if job is None or (job["state"] == "INACTIVE" and os.environ.get("STANDIN_FLUX_PURGE") == "1"):
            common.die("flux-jobs", f"ERROR: {job_id}: unknown job id", 1)
        assert job is not None
        active = job["state"] != "INACTIVE"
        rc = job.get("returncode", 0)
        fields = {
            "state": job["state"],
            "result": "" if active else job["result"],
            "returncode": "" if active else rc,
        }
        print(args.format.format(**fields))
    return 0


def hostlist(argv: list[str]) -> int:
    p = Refuse(prog="hostlist", add_help=False)
    p.add_argument("-n", "--nth", type=int)
    p.add_argument("source", nargs="?", default="local")
    args = p.parse_args(argv)
    if args.source != "instance":
        common.die("flux-hostlist", f"unsupported source {args.source!r}", 1)
    hosts = os.environ.get("STANDIN_FLUX_HOSTS", "node1").split(",")
    print(hosts[args.nth] if args.nth is not None else ",".join(hosts))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run_job(sys.argv[2])
        sys.exit(0)
    common.log_call("flux", sys.argv[1:])
    commands = {"batch": batch, "run": run, "jobs": jobs, "hostlist": hostlist}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        common.die("flux", f"unknown command; known: {', '.join(commands)}", 1)
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
