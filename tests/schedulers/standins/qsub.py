"""Stand-in for PBS Pro's `qsub SCRIPT`, as its reference documents it.

Reads the `#PBS` directives at the top of the script (options given on the command line win), refuses
options and resource requests it does not know, prints the job id (`1234.pbs-standin`) and runs the script in
the background as the server would: in the home directory, with PBS_JOBID, PBS_JOBNAME, PBS_O_WORKDIR (where
qsub ran) and PBS_NODEFILE (one line per chunk of `-l select=N`). job_state goes Q, R, then F with
Exit_status (the script's status; 256 + the signal when it was killed). Output goes to `-o` (else
NAME.oSEQ in the submit directory), joined with stderr under `-j oe`.

Knobs (environment): STANDIN_STATE (directory for job records and the call log), STANDIN_QSUB_REFUSE (a
message: refuse the job with it, exit 1).
"""

from __future__ import annotations

import os
import re
import shlex
import sys

import common

_LONE = {"-N", "-l", "-q", "-A", "-k", "-j", "-o", "-e", "-r", "-W"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,235}$")
_RESOURCE = re.compile(
    r"^(select=\d+(:[A-Za-z_]\w*=[\w.-]+)*|place=[\w:]+|walltime=\d+:\d\d:\d\d|filesystems=[\w.-]+(:[\w.-]+)*)$"
)


def parse(words: list[str], opts: dict[str, list[str]]) -> str | None:
    """Options into `opts`; returns the script operand if any."""
    i = 0
    while i < len(words):
        w = words[i]
        if w not in _LONE:
            if w.startswith("-"):
                common.die(
                    "qsub", f"invalid option -- '{w.lstrip('-')}'\nusage: qsub [-A account] ... script"
                )
            return w
        if i + 1 >= len(words):
            common.die("qsub", f"option requires an argument -- '{w[1:]}'")
        opts.setdefault(w, []).append(words[i + 1])
        i += 2
    return None


def directives(script: str) -> dict[str, list[str]]:
    opts: dict[str, list[str]] = {}
    with open(script) as f:
        for n, line in enumerate(f):
            if n == 0 and line.startswith("#!"):
                continue
            if line.startswith("#PBS"):
                parse(shlex.split(line[4:]), opts)
            elif line.strip() and not line.startswith("#"):
                break  # directives end at the first command, as qsub reads them
    return opts


def submit(argv: list[str]) -> None:
    cli: dict[str, list[str]] = {}
    script = parse(argv, cli)
    if script is None or not os.path.isfile(script):
        common.die("qsub", f"script file {script!r} cannot be read", 1)
    if os.environ.get("STANDIN_QSUB_REFUSE"):
        common.die("qsub", os.environ["STANDIN_QSUB_REFUSE"], 1)
    opts = {**directives(script), **cli}
    name = opts.get("-N", [os.path.basename(script)])[-1]
    if not _NAME.match(name):
        common.die("qsub", f"illegal -N value {name!r}", 2)
    nodes = 1
    for res in opts.get("-l", []):
        if not _RESOURCE.match(res):
            common.die("qsub", f"Unknown resource or bad value in -l {res!r}", 2)
        if res.startswith("select="):
            nodes = int(res.split("=", 1)[1].split(":", 1)[0])
    seq = common.next_seq()
    job_id = f"{seq}.pbs-standin"
    workdir = os.getcwd()
    out = opts.get("-o", [os.path.join(workdir, f"{name}.o{seq}")])[-1]
    joined = opts.get("-j", ["n"])[-1] == "oe"
    err = None if joined else opts.get("-e", [os.path.join(workdir, f"{name}.e{seq}")])[-1]
    common.save_job(
        {
            "id": job_id,
            "name": name,
            "state": "Q",
            "script": os.path.abspath(script),
            "nodes": nodes,
            "workdir": workdir,
            "out": out,
            "err": err,
            "queue": opts.get("-q", ["workq"])[-1],
        }
    )
    common.start_background("qsub", job_id)
    print(job_id)


def run(job_id: str) -> None:
    job = common.load_job(job_id)
    assert job is not None
    nodefile = common.state_dir() / f"{job_id}.nodes"
    nodefile.write_text("".join(f"node{i}\n" for i in range(1, job["nodes"] + 1)))
    env = {
        **os.environ,
        "PBS_JOBID": job_id,
        "PBS_JOBNAME": job["name"],
        "PBS_O_WORKDIR": job["workdir"],
        "PBS_NODEFILE": str(nodefile),
        "PBS_QUEUE": job["queue"],
    }
    job["state"] = "R"
    common.save_job(job)
    rc = common.run_script(job["script"], env, os.environ.get("HOME", "/"), job["out"], job["err"])
    job["state"], job["exit_status"] = "F", (256 - rc if rc < 0 else rc)
    common.save_job(job)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run(sys.argv[2])
    else:
        common.log_call("qsub", sys.argv[1:])
        submit(sys.argv[1:])
