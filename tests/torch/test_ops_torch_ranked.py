"""The timeline that HPCRING_TIMELINE asks for, written while tests/ranked/torch_ops ran.

The torch_ops launches (tests/ranked/launches.py: 2 ranks on one node, 4 ranks on 2 emulated nodes) set
HPCRING_TIMELINE; their tests are reported one by one under tests/ranked. Here the file rank 0 wrote must be a
valid Chrome trace (valid JSON means the array was closed at shutdown) holding the engine's events.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranked_records import LaunchResult
from ranked_spec import uses_launches


@pytest.mark.mpi
@uses_launches("torch_ops/openmpi-np2", "torch_ops/openmpi-np4-2nodes")
def test_env_timeline_is_a_closed_chrome_trace(ranked_launch: LaunchResult) -> None:
    events = json.loads(Path(ranked_launch.env["HPCRING_TIMELINE"]).read_text())
    names = {e["name"] for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "COLLECTIVE"} <= names, sorted(names)
