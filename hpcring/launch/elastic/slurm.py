"""Elastic steps in a Slurm allocation: `python -m hpcring.launch.elastic.slurm --min-nodes N -- srun ...`.

A job rendered with `elastic: {min_nodes: N}` asks Slurm not to kill it when a node fails (`#SBATCH
--no-kill`) and runs each step through this runner, in the batch script. The runner starts the step's srun
on the allocation's nodes that are still usable; when the step fails it finds the node that was lost (a node
srun reports a node failure on or Slurm now marks down or not responding; failing that, the first node srun
reports a failed task on), says so, and runs the step again on the nodes left, as long as at least
`--min-nodes` remain and `--max-restarts` is not exceeded. The ranks resume from their last commit in
node-local memory (hpcring.torch.elastic: HPCRING_ELASTIC_DIR is `/dev/shm/hpcring-elastic-$SLURM_JOB_ID`,
the same on every node).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from hpcring.contracts import elastic as contract

# "srun: error: node3: task 2: Killed", "srun: error: node3: tasks 4-5: Exited with exit code 1"
_TASK_FAILED = re.compile(r"srun: error: (\S+): tasks? [\d,\-]+: (.+)$")
# slurmctld marked a node of the step DOWN (its slurmd stopped answering for SlurmdTimeout) and told srun
_NODE_FAILED = re.compile(r"srun: error: Node failure on (\S+)$")
NODE_FAILURE = "node failure"
_BAD_STATES = ("down", "drain", "fail", "maint", "unk", "*")


def _run(argv: Sequence[str]) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    return out.stdout if out.returncode == 0 else ""


def allocation_nodes(env: dict[str, str]) -> list[str]:
    """The job's nodes, in Slurm's order."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise SystemExit("hpcring elastic: SLURM_JOB_NODELIST is not set: run this inside a Slurm job")
    return _run(["scontrol", "show", "hostnames", nodelist]).split() or nodelist.split(",")


def unusable(nodes: Sequence[str]) -> dict[str, str]:
    """Nodes Slurm reports as down, drained, failing or not responding, with their state."""
    if not nodes:
        return {}
    out = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"])
    bad: dict[str, str] = {}
    for line in out.splitlines():
        name, _, state = line.strip().partition(" ")
        if any(b in state.lower() for b in _BAD_STATES):
            bad[name] = state
    return bad


def _flag_value(argv: Sequence[str], name: str) -> int | None:
    for arg in argv:
        if arg.startswith(f"{name}="):
            try:
                return int(arg.split("=", 1)[1])
            except ValueError:
                return None
    return None


def step_argv(srun: Sequence[str], live: Sequence[str], nodes_before: int) -> list[str]:
    """The srun line for the nodes left: --nodes, --ntasks (ranks per node kept) and --nodelist."""
    per_node = _flag_value(srun, "--ntasks-per-node")
    ntasks = _flag_value(srun, "--ntasks")
    if per_node is None and ntasks is not None:
        per_node = max(1, ntasks // max(1, nodes_before))
    out = [srun[0], f"--nodes={len(live)}", f"--nodelist={','.join(live)}"]
    if per_node is not None:
        out.append(f"--ntasks={per_node * len(live)}")
    for arg in srun[1:]:
        if arg.startswith(("--nodes=", "--ntasks=", "--nodelist=")):
            continue
        out.append(arg)
    return out


def _relay(stream: IO[str], sink: IO[str], failed: list[tuple[str, str]]) -> None:
    """Pass srun's stderr through, remembering which nodes it reports failed tasks or a node failure on
    (first first; a node failure as (node, NODE_FAILURE))."""
    for line in stream:
        sink.write(line)
        sink.flush()
        m = _TASK_FAILED.search(line.strip())
        if m:
            failed.append((m.group(1), m.group(2)))
        elif n := _NODE_FAILED.search(line.strip()):
            failed.append((n.group(1), NODE_FAILURE))


def lost_after_failure(
    failed: Sequence[tuple[str, str]], live: Sequence[str], down: dict[str, str]
) -> dict[str, str]:
    """The step's nodes to leave out after it failed, with why.

    Slurm's own verdict comes first: a node srun was told failed ("Node failure on node3") or that Slurm now
    reports down. srun then kills the tasks on the other nodes and reports those as failed too ("node1: task
    0: Killed"): consequences, not losses, so they are ignored. Without such a verdict the node lost is the
    first one srun reported a failed task on (its ranks died first; the others were ended after them).
    """
    verdict = {n: "Slurm reports a node failure" for n, how in failed if how == NODE_FAILURE and n in live}
    for node, state in down.items():
        verdict.setdefault(node, f"Slurm reports it {state}")
    if verdict:
        return verdict
    culprit = next(((n, how) for n, how in failed if n in live), None)
    return {culprit[0]: f"its task {culprit[1]}"} if culprit else {}


def run_step(argv: Sequence[str], env: dict[str, str]) -> tuple[int, list[tuple[str, str]]]:
    """Run one attempt; (exit code, [(node, how its task ended)] in the order srun reported them)."""
    proc = subprocess.Popen(list(argv), env=env, stderr=subprocess.PIPE, text=True)
    failed: list[tuple[str, str]] = []
    assert proc.stderr is not None
    relay = threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, failed), daemon=True)
    relay.start()
    rc = proc.wait()
    relay.join(timeout=10)
    return rc, failed


def say(text: str) -> None:
    print(f"hpcring elastic: {text}", file=sys.stderr, flush=True)


def main(args_in: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.launch.elastic.slurm", description=__doc__)
    parser.add_argument("--min-nodes", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("srun", nargs=argparse.REMAINDER)
    args = parser.parse_args(args_in)
    srun = args.srun[1:] if args.srun[:1] == ["--"] else args.srun
    if not srun:
        parser.error("give the srun line after --")
    env = dict(os.environ)
    job = env.get("SLURM_JOB_ID", str(os.getpid()))
    env.setdefault(contract.DIRECTORY, f"/dev/shm/hpcring-elastic-{job}")
    env.update({contract.ELASTIC: "1", "HOROVOD_ELASTIC": "1"})
    nodes = allocation_nodes(env)
    first_count = _flag_value(srun, "--nodes") or len(nodes)
    lost: dict[str, str] = {}
    restarts = 0
    while True:
        down = unusable([n for n in nodes if n not in lost])
        lost.update({n: f"Slurm reports it {s}" for n, s in down.items()})
        live = [n for n in nodes if n not in lost][:first_count]
        if len(live) < args.min_nodes:
            say(
                f"only {len(live)} node(s) left ({', '.join(live) or 'none'}; lost: "
                f"{', '.join(f'{n} ({why})' for n, why in lost.items())}), fewer than min_nodes "
                f"{args.min_nodes}; ending the job"
            )
            return 1
        env[contract.GENERATION] = str(restarts)
        argv = step_argv(srun, live, first_count)
        say(f"attempt {restarts + 1}: {len(live)} node(s): {','.join(live)}")
        rc, failed = run_step(argv, env)
        if rc == 0:
            return 0
        newly = lost_after_failure(failed, live, unusable(live))
        if not newly:
            say(f"the step failed (exit {rc}) without naming a node; running it again on the same nodes")
        for node, why in newly.items():
            lost[node] = why
            say(f"lost node {node} ({why})")
        restarts += 1
        if restarts > args.max_restarts:
            say(f"max_restarts {args.max_restarts} reached; ending the job with the step's exit code {rc}")
            return rc
        left = [n for n in nodes if n not in lost][:first_count]
        say(
            f"relaunching the step on {','.join(left) or 'no node'} from the last commit (restart {restarts})"
        )


if __name__ == "__main__":
    sys.exit(main())
