"""One task of an elastic Slurm step (tests/integration/slurm/test_slurm_elastic.py); needs no MPI or torch.

In the first attempt (HPCRING_ELASTIC_GENERATION=0) the task on KILL_NODE SIGKILLs itself, as a node that dies
takes its ranks with it, and the others wait to be ended by srun. In a later attempt every task writes a JSON
report (attempt, node, nodes in the step, the elastic variables it got) and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

out, kill_node = Path(sys.argv[1]), sys.argv[2]
generation = int(os.environ["HPCRING_ELASTIC_GENERATION"])
node = os.environ["SLURMD_NODENAME"]
if generation == 0:
    if node == kill_node:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # srun ends it (--kill-on-bad-exit) when the other node's task dies
    sys.exit(3)
report = {
    "generation": generation,
    "node": node,
    "rank": int(os.environ["SLURM_PROCID"]),
    "nodes": int(os.environ["SLURM_STEP_NUM_NODES"]),
    "tasks": int(os.environ["SLURM_STEP_NUM_TASKS"]),
    "elastic": os.environ.get("HPCRING_ELASTIC"),
    "directory": os.environ.get("HPCRING_ELASTIC_DIR"),
}
(out / f"report-{report['rank']}.json").write_text(json.dumps(report))
