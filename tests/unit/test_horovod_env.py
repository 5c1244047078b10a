"""Every HOROVOD_* variable is honoured or reported: the registry, the docs table, the engine, and init()."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from support import ROOT, RunRanks

from hpcring.config import engine_settings
from hpcring.horovod_env import BY_NAME, VARIABLES, ignored_settings

# What Horovod 0.28 reads at run time: the `#define HOROVOD_* "HOROVOD_*"` names of horovod/common/common.h,
# HOROVOD_LOG_LEVEL / HOROVOD_LOG_HIDE_TIME (common/logging.cc), the Gloo context's variables
# (common/gloo/gloo_context.cc) and HOROVOD_DYNAMIC_PROCESS_SETS (torch/mpi_ops.py).
HOROVOD_READS = [
    "ELASTIC",
    "MPI_THREADS_DISABLE",
    "TIMELINE",
    "TIMELINE_MARK_CYCLES",
    "AUTOTUNE",
    "AUTOTUNE_LOG",
    "AUTOTUNE_WARMUP_SAMPLES",
    "AUTOTUNE_STEPS_PER_SAMPLE",
    "AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
    "FUSION_THRESHOLD",
    "CYCLE_TIME",
    "STALL_CHECK_DISABLE",
    "STALL_CHECK_TIME_SECONDS",
    "STALL_SHUTDOWN_TIME_SECONDS",
    "HIERARCHICAL_ALLREDUCE",
    "HIERARCHICAL_ALLGATHER",
    "TORUS_ALLREDUCE",
    "CACHE_CAPACITY",
    "BATCH_D2D_MEMCOPIES",
    "NUM_NCCL_STREAMS",
    "CPU_OPERATIONS",
    "CONTROLLER",
    "CCL_CACHE",
    "GLOO_IFACE",
    "ADASUM_MPI_CHUNK_SIZE",
    "THREAD_AFFINITY",
    "DISABLE_GROUP_FUSION",
    "DISABLE_NVTX_RANGES",
    "ENABLE_ASYNC_COMPLETION",
    "DYNAMIC_PROCESS_SETS",
    "ENABLE_XLA_OPS",
    "LOG_LEVEL",
    "LOG_HIDE_TIME",
    "RANK",
    "SIZE",
    "LOCAL_RANK",
    "LOCAL_SIZE",
    "CROSS_RANK",
    "CROSS_SIZE",
    "HOSTNAME",
    "GLOO_RENDEZVOUS_ADDR",
    "GLOO_RENDEZVOUS_PORT",
    "GLOO_TIMEOUT_SECONDS",
]

# A value that differs from the default, for each engine variable hpcring honours.
ENGINE_VALUES = {
    "HOROVOD_FUSION_THRESHOLD": "1048576",
    "HOROVOD_CYCLE_TIME": "3.5",
    "HOROVOD_CACHE_CAPACITY": "7",
    "HOROVOD_TIMELINE": "/nonexistent/t.json",
    "HOROVOD_TIMELINE_MARK_CYCLES": "1",
    "HOROVOD_STALL_CHECK_DISABLE": "1",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
    "HOROVOD_LOG_LEVEL": "debug",
    "HOROVOD_NUM_NCCL_STREAMS": "2",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "1",
    "HOROVOD_GPU_OPERATIONS": "MPI",
    "HOROVOD_GPU_ALLREDUCE": "MPI",
}


def test_every_variable_horovod_reads_has_an_answer() -> None:
    missing = [f"HOROVOD_{n}" for n in HOROVOD_READS if f"HOROVOD_{n}" not in BY_NAME]
    assert not missing, f"not in hpcring/horovod_env.py: {missing}"
    assert len(BY_NAME) == len(VARIABLES)  # no name twice
    assert all(v.what.strip() for v in VARIABLES)


def test_docs_table_matches_the_registry() -> None:
    text = (ROOT / "docs" / "guide" / "torch.md").read_text()
    section = text.split("## HOROVOD_* variables", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(HOROVOD_[A-Z0-9_]+)` \| ([^|]+) \|", section, re.M)
    assert [name for name, _ in rows] == [v.name for v in VARIABLES]
    for name, status in rows:
        assert status.strip().startswith("ignored") == (not BY_NAME[name].honoured), name


@pytest.mark.parametrize("var", sorted(ENGINE_VALUES))
def test_honoured_engine_variables_change_the_engine_settings(var: str) -> None:
    assert BY_NAME[var].honoured
    assert engine_settings({var: ENGINE_VALUES[var]}) != engine_settings({})
    assert not ignored_settings({var: ENGINE_VALUES[var]})


def test_ignored_values_are_reported_with_what_to_do_instead() -> None:
    env = {
        "HOROVOD_TORUS_ALLREDUCE": "1",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_CONTROLLER": "MPI",  # honoured value, any case
        "HOROVOD_FUSION_THRESHOLD": "1024",
        "PATH": "/bin",
    }
    lines = dict(line.split(" is ignored: ", 1) for line in ignored_settings(env))
    assert sorted(lines) == ["HOROVOD_CPU_OPERATIONS=gloo", "HOROVOD_TORUS_ALLREDUCE=1"], lines
    assert "hierarchical" in lines["HOROVOD_TORUS_ALLREDUCE=1"]
    assert "MPI" in lines["HOROVOD_CPU_OPERATIONS=gloo"]


PROGRAM = """
import hpcring.torch as hvd, torch
for _ in range(2):  # a second init() must not report again
    hvd.init()
    assert hvd.allreduce(torch.ones(3), op=hvd.Sum)[0].item() == hvd.size()
    hvd.shutdown()
print("done", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("np", [1, 2])
def test_init_reports_ignored_settings_once_on_rank_zero(
    hpcring_run: RunRanks, tmp_path: Path, np: int
) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = {"HOROVOD_TORUS_ALLREDUCE": "1", "HOROVOD_THREAD_AFFINITY": "0,1", "HOROVOD_CYCLE_TIME": "2"}
    proc = hpcring_run(np, [sys.executable, str(script)], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("done") == np
    err = proc.stderr
    assert err.count("Horovod settings that hpcring does not act on") == 1, err
    assert "[0]<stderr>:" in err.split("Horovod settings that hpcring does not act on")[0].splitlines()[-1]
    assert err.count("HOROVOD_TORUS_ALLREDUCE=1 is ignored") == 1
    assert err.count("HOROVOD_THREAD_AFFINITY=0,1 is ignored") == 1
    assert "HOROVOD_CYCLE_TIME" not in err
