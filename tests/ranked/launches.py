"""Every launch of the ranked tests: which files run on how many ranks, with which MPI, nodes and settings.

The outer pytest turns each (ranked test, launch) into one item, `...::test_x[openmpi-np4]`, and starts each
launch once per session (tests/ranked_plugin.py; docs/dev/testing.md). Paths are relative to tests/ranked.
Launches are few on purpose: each costs seconds of process start-up on 2 cores.
"""

from __future__ import annotations

from ranked_spec import Launch

# Node layout matters only to topology and allreduce (hierarchical); the other ops use the world group alone.
COLLECTIVE_LAYOUT = (
    "collective/test_ranked_collective_topology.py",
    "collective/test_ranked_collective_allreduce.py",
)
TORCH_WARNINGS = ("-W", "ignore::UserWarning")
AUTOTUNE = {
    "HOROVOD_AUTOTUNE": "1",
    "HOROVOD_AUTOTUNE_LOG": "{tmp}/autotune.csv",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",  # small samples: the whole search fits in a short run
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6",
}
# MPICH across the fake nodes: OFI's tcp provider on the node's veth, not UCX (UCX cards overrun MPICH's PMI
# lines at random, tests/integration/slurm/profiles/emulated-srun.yaml says how, and would use shared memory
# across namespaces: one kernel).
MPICH_OVER_VETH = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}

LAUNCHES = (
    # hpcring.collective: every op at several world sizes, layouts and MPI flavours.
    Launch(("collective",), np=1, timeout=600),
    Launch(("collective",), np=2, timeout=600),
    Launch(("collective",), np=4, timeout=600),
    Launch(COLLECTIVE_LAYOUT, np=4, emulate_nodes=2, timeout=600),
    Launch(COLLECTIVE_LAYOUT, np=3, emulate_nodes=2, timeout=600),  # heterogeneous: 2 + 1
    Launch(("collective",), np=2, flavour="mpich", timeout=600),
    Launch(COLLECTIVE_LAYOUT, np=4, flavour="mpich", emulate_nodes=2, timeout=600),
    # The engine, numpy only (tests/engine/test_engine_stall.py runs the stall program).
    Launch(("engine",), np=1),
    Launch(("engine",), np=2, flavour="mpich"),
    Launch(("engine",), np=3, emulate_nodes=2),
    Launch(("engine",), np=4),
    # hpcring.torch ops, with the timeline set by the environment (tests/torch/test_ops_torch_ranked.py
    # checks the file).
    *(
        Launch(
            ("torch_ops",),
            np=np,
            emulate_nodes=nodes,
            env={"HPCRING_TIMELINE": "{tmp}/env-timeline.json"},
            pytest_args=(*TORCH_WARNINGS, "-o", "faulthandler_timeout=200"),
            timeout=300,
            requires=("torch",),
        )
        for np, nodes in ((2, None), (4, 2))
    ),
    # The compiled lone cycle (engine/lone_cycle.py) at 1, 2 and 4 ranks: no timeline records there, so
    # its plain cycles run (the launches above record one, and every cycle of theirs is Python's).
    *(
        Launch(
            ("torch_ops/test_torch_ops_lone_cycle.py",),
            np=np,
            pytest_args=(*TORCH_WARNINGS, "-o", "faulthandler_timeout=100"),
            timeout=150,
            requires=("torch",),
            name=f"openmpi-np{np}-lone",
        )
        for np in (1, 2, 4)
    ),
    # The device data plane on CPU tensors: gloo standing in for NCCL (flat at 2 and 4 ranks; hierarchical on
    # 2 emulated nodes with two ranks each, and with one rank each: the cross-node stage alone, no world
    # group), and the MPI route's stand-in (staged through host memory, the host plane's algorithms).
    *(
        Launch(
            ("device_plane",),
            np=np,
            emulate_nodes=nodes,
            env={
                "HPCRING_CPU_DEVICE_PLANE": plane,
                **({"HPCRING_ALLREDUCE_ALGORITHM": "hierarchical"} if nodes else {}),
            },
            pytest_args=(*TORCH_WARNINGS, "-o", "faulthandler_timeout=250"),
            timeout=400,
            requires=("torch",),
            name=f"openmpi-np{np}{f'-{nodes}nodes' if nodes else ''}-{plane}",
        )
        for np, nodes, plane in (
            (2, None, "gloo"),
            (4, None, "gloo"),
            (4, 2, "gloo"),
            (2, 2, "gloo"),
            (2, None, "mpi"),
        )
    ),
    # op=hvd.Adasum (allreduce and DistributedOptimizer) against a NumPy reference: the host plane at 1, 2 and
    # 4 ranks, the refusal at 3 (not a power of two), Horovod's GPU form on the process-group route's
    # stand-in (4 ranks on 2 emulated nodes; one rank per node: the cross-node stage alone), and the MPI
    # route's stand-in.
    *(
        Launch(
            paths,
            np=np,
            emulate_nodes=nodes,
            env={"HPCRING_CPU_DEVICE_PLANE": plane} if plane else {},
            pytest_args=(*TORCH_WARNINGS, "-o", "faulthandler_timeout=200"),
            timeout=300,
            requires=("torch",),
            name=f"openmpi-np{np}{f'-{nodes}nodes' if nodes else ''}{f'-{plane}' if plane else ''}",
        )
        for np, nodes, plane, paths in (
            (1, None, "", ("adasum",)),
            (2, None, "", ("adasum",)),
            (4, None, "", ("adasum",)),
            (3, None, "", ("adasum/test_adasum_ranks.py",)),
            (4, 2, "gloo", ("adasum",)),
            (2, 2, "gloo", ("adasum/test_adasum_allreduce.py",)),
            (2, None, "mpi", ("adasum",)),
        )
    ),
    # Data-parallel training: DistributedOptimizer, broadcast helpers, SyncBatchNorm, the equivalence proof.
    *(
        Launch(
            ("torch_train",),
            np=np,
            emulate_nodes=nodes,
            pytest_args=(*TORCH_WARNINGS, "-o", "faulthandler_timeout=250"),
            timeout=400,
            requires=("torch",),
        )
        for np, nodes in ((2, None), (4, 2))
    ),
    # At one rank nothing is reduced (no hooks, as Horovod), in the first step or any later one: the bucket
    # and optimizer tests must still hold there.
    Launch(
        ("torch_train/test_buckets_ranked.py", "torch_train/test_optimizer_ranked.py"),
        np=1,
        timeout=200,
        requires=("torch",),
    ),
    # Horovod scripts unchanged: `hpcring run --horovod` answers `import horovod` with hpcring in every rank.
    *(
        Launch(
            ("horovod_alias",),
            np=np,
            launcher_args=("--horovod",),
            pytest_args=TORCH_WARNINGS,
            timeout=300,
            requires=("torch",),
        )
        for np in (1, 2, 4)
    ),
    # HOROVOD_AUTOTUNE; one rank reduces only in elastic mode, as Horovod.
    *(
        Launch(
            ("autotune",),
            np=np,
            env={**AUTOTUNE, "HPCRING_ELASTIC": "1" if np == 1 else "0"},
            pytest_args=TORCH_WARNINGS,
            timeout=300,
            requires=("torch",),
        )
        for np in (1, 2, 4)
    ),
    # Two fake nodes (network namespaces), two ranks each, over real TCP (root only; see
    # docs/dev/fake-cluster.md; tests/integration/netns/test_netns_two_nodes.py checks the link counters).
    # The fake nodes share this machine's cores, which Open MPI cannot see: it yields when idle.
    *(
        Launch(
            ("netns",),
            np=4,
            flavour=flavour,
            env=MPICH_OVER_VETH if flavour == "mpich" else {},
            launcher_args=("--yield-when-idle", "on"),
            pytest_args=("-s",),
            site="tests/integration/netns/netns_cluster.py:RankedSite",
            markers=("integration",),
            name=f"{flavour}-2x2-netns",
        )
        for flavour in ("openmpi", "mpich")
    ),
)
