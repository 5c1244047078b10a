"""Stand-in for PBS Pro's `qstat -f [-x] [-F json] JOB_ID`, as its reference documents it.

`-f` prints the job's attributes (`job_state`, `Exit_status` once finished, ...), as text or, with `-F json`,
as `{"Jobs": {ID: {...}}}`. A finished job is shown only with `-x` (job history); without it qstat says the
job has finished. An id the server does not know: "Unknown Job Id", exit 153.

Knobs (environment): STANDIN_PBS_HISTORY=0 (the server keeps no job history: a job vanishes from qstat, even
with -x, once it has ended), STANDIN_QSTAT_NO_JSON=1 (an older qstat without `-F`).
"""

from __future__ import annotations

import json
import os
import sys
import time

import common


def attributes(job: dict[str, object]) -> dict[str, object]:
    attrs: dict[str, object] = {"Job_Name": job["name"], "job_state": job["state"], "queue": job["queue"]}
    if job["state"] == "F":
        attrs["Exit_status"] = job["exit_status"]
    return attrs


def main(argv: list[str]) -> int:
    history = fmt_json = False
    ids: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-x":
            history = True
        elif a == "-f":
            pass
        elif a == "-F":
            if os.environ.get("STANDIN_QSTAT_NO_JSON") == "1":
                common.die("qstat", "invalid option -- 'F'\nusage: qstat [-f] [-x] job_identifier...", 2)
            if argv[i + 1] != "json":
                common.die("qstat", f"unsupported output format {argv[i + 1]!r}", 2)
            fmt_json = True
            i += 1
        elif a.startswith("-"):
            common.die("qstat", f"invalid option -- '{a[1:]}'", 2)
        else:
            ids.append(a)
        i += 1
    (job_id,) = ids
    job = common.load_job(job_id) or common.load_job(f"{job_id}.pbs-standin")
    if job is None or (job["state"] == "F" and os.environ.get("STANDIN_PBS_HISTORY") == "0"):
        print(f"qstat: Unknown Job Id {job_id}", file=sys.stderr)
        return 153
    if job["state"] == "F" and not history:
        print(
            f"qstat: {job['id']} Job has finished, use -x or -H to obtain historical job information",
            file=sys.stderr,
        )
        return 35
    attrs = attributes(job)
    if fmt_json:
        print(
            json.dumps(
                {
                    "timestamp": int(time.time()),
                    "pbs_version": "2022.1.0",
                    "pbs_server": "pbs-standin",
                    "Jobs": {job["id"]: attrs},
                },
                indent=4,
            )
        )
    else:
        print(f"Job Id: {job['id']}")
        for k, v in attrs.items():
            print(f"    {k} = {v}")
    return 0


if __name__ == "__main__":
    common.log_call("qstat", sys.argv[1:])
    sys.exit(main(sys.argv[1:]))
