"""Stand-in for `mpiexec` inside a PBS job, in its two documented dialects, starting every rank here.

Cray PALS: `mpiexec -n N --ppn P [--depth D] [--cpu-bind list:A:B:...|depth|none] command...`; each rank gets
PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, PMI_RANK, PMI_SIZE. MPICH hydra: `mpiexec -n N -ppn P
[-bind-to user:A,B,...|none] command...` (CPUs of one rank joined by `+`); each rank gets PMI_RANK, PMI_SIZE,
MPI_LOCALRANKID, MPI_LOCALNRANKS. Ranks fill the job's hosts (PBS_NODEFILE, in order) P at a time.

No CPU of the profile's node need exist here, so binding is not applied: each rank is told the host it would
run on and the CPUs it would be bound to (STANDIN_HOST, STANDIN_CPUS) so that tests can check the placement.
A bind list with fewer entries than ranks per node, or more ranks than the hosts' slots, is refused.
"""

from __future__ import annotations

import os
import sys

import common

PALS_FLAGS = {"-n", "--ppn", "--depth", "--cpu-bind"}
HYDRA_FLAGS = {"-n", "-ppn", "-bind-to"}


def parse(argv: list[str]) -> tuple[str, dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] not in PALS_FLAGS | HYDRA_FLAGS or i + 1 >= len(argv):
            common.die("mpiexec", f"unrecognized argument {argv[i]}")
        opts[argv[i]] = argv[i + 1]
        i += 2
    flags = set(opts)
    if flags <= PALS_FLAGS and "--ppn" in flags:
        dialect = "pals"
    elif flags <= HYDRA_FLAGS:
        dialect = "hydra"
    else:
        common.die("mpiexec", f"flags of two launchers mixed: {sorted(flags)}")
    if not argv[i:]:
        common.die("mpiexec", "no command given")
    return dialect, opts, argv[i:]


def binding(dialect: str, opts: dict[str, str], ppn: int) -> list[list[int] | None]:
    """CPUs of each local rank (None: unbound)."""
    spec = opts.get("--cpu-bind" if dialect == "pals" else "-bind-to", "none")
    if spec == "none":
        return [None] * ppn
    if dialect == "pals" and spec == "depth":
        depth = int(opts.get("--depth", "1"))
        return [list(range(i * depth, (i + 1) * depth)) for i in range(ppn)]
    kind, _, lists = spec.partition(":")
    if kind != ("list" if dialect == "pals" else "user"):
        common.die("mpiexec", f"unsupported binding {spec!r}")
    if dialect == "pals":
        per_rank = [common.cpu_list(x) for x in lists.split(":")]
    else:
        per_rank = [[int(c) for c in x.split("+")] for x in lists.split(",")]
    if len(per_rank) < ppn:
        common.die("mpiexec", f"binding lists {len(per_rank)} CPU sets for {ppn} ranks per node")
    return list(per_rank[:ppn])


def main(argv: list[str]) -> int:
    dialect, opts, command = parse(argv)
    size = int(opts["-n"])
    ppn = int(opts["--ppn" if dialect == "pals" else "-ppn"])
    with open(os.environ["PBS_NODEFILE"]) as f:
        hosts = list(dict.fromkeys(line.strip() for line in f if line.strip()))
    if size > ppn * len(hosts):
        common.die("mpiexec", f"{size} ranks do not fit {len(hosts)} host(s) x {ppn}")
    cpus = binding(dialect, opts, ppn)
    tasks = []
    for rank in range(size):
        node, local = divmod(rank, ppn)
        env = {**os.environ, "PMI_RANK": str(rank), "PMI_SIZE": str(size), "STANDIN_HOST": hosts[node]}
        if dialect == "pals":
            env.update(PALS_RANKID=str(rank), PALS_LOCAL_RANKID=str(local), PALS_NODEID=str(node))
        else:
            on_node = min(ppn, size - node * ppn)
            env.update(MPI_LOCALRANKID=str(local), MPI_LOCALNRANKS=str(on_node))
        bound = cpus[local]
        env["STANDIN_CPUS"] = "none" if bound is None else common.format_cpus(bound)
        tasks.append((command, env))
    return common.run_tasks(tasks)


if __name__ == "__main__":
    common.log_call("mpiexec", sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
