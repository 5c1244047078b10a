"""Kubernetes (Kubeflow MPI Operator): the MPIJob plan and manifest for several job shapes and MPIs, each
checked against the MPIJob CRD's own OpenAPI schema (shipped as data), manifests that break the schema caught,
the per-rank GPU wrapper run under bash as the ranks would run it, and the profile's kubernetes fields
validated. No Kubernetes cluster can run here: everything short of one is tested."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_helpers import PROFILE, containers, manifest, plan, variant, write_exe
from kubelet import kubelet_expand

from hpcring.errors import ConfigError, ProfileError
from hpcring.schedulers import kubernetes_crd, kubernetes_manifest, mapping, profile
from hpcring.schedulers.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]

# (nodes, ranks, gpus per rank, mpi, binding)
SHAPES = [
    (1, None, None, "openmpi", True),
    (2, None, None, "openmpi", True),
    (4, 16, 2, "openmpi", True),
    (3, 6, 4, "openmpi", False),
    (2, 4, 0, "openmpi", True),
    (2, 16, 1, "mpich", True),
    (2, 8, 2, "mpich", False),
    (2, 16, 1, "intel-mpi", True),
    (1, 4, 1, "intel-mpi", False),
]


@pytest.mark.parametrize(("nodes", "ranks", "gpus", "mpi", "binding"), SHAPES)
def test_manifest_for_shape_matches_crd_and_mapping(
    nodes: int, ranks: int | None, gpus: int | None, mpi: str, binding: bool
) -> None:
    prof = variant(mpi, binding)
    spec = JobSpec(nodes=nodes, ranks=ranks, gpus_per_rank=gpus)
    rm = mapping.build(prof, spec)
    p = plan(prof, nodes=nodes, ranks=ranks, gpus_per_rank=gpus)
    obj = manifest(p)
    assert obj == kubernetes_manifest.to_object(p)
    assert kubernetes_crd.errors(obj) == []
    s = rm.shape
    job = obj["spec"]
    assert job["mpiImplementation"] == {"openmpi": "OpenMPI", "mpich": "MPICH", "intel-mpi": "Intel"}[mpi]
    assert job["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    assert job["mpiReplicaSpecs"]["Worker"]["replicas"] == nodes
    assert job["slotsPerWorker"] == s.ranks // nodes == s.max_ranks_per_node
    (launcher,) = containers(obj, "Launcher")
    (worker,) = containers(obj, "Worker")
    cmd = launcher["command"]
    env_names = [e["name"] for e in launcher["env"]]
    if mpi == "openmpi":
        # PRRTE reads the operator's hostfile only from the command line; the pods run as root (/root/.ssh).
        assert cmd[:6] == [
            "mpirun",
            "--hostfile",
            "/etc/mpi/hostfile",
            "--allow-run-as-root",
            "-n",
            str(s.ranks),
        ]
        pe = f":PE={s.cpus_per_rank}" if binding else ""
        assert cmd[6:10] == [
            "--map-by",
            f"ppr:{s.max_ranks_per_node}:node{pe}",
            "--bind-to",
            "core" if binding else "none",
        ]
        forwarded = [cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"]
        assert forwarded == ["PATH", "LD_LIBRARY_PATH", *env_names]
    else:
        assert cmd[:7] == [
            "mpirun",
            "-f",
            "/etc/mpi/hostfile",
            "-n",
            str(s.ranks),
            "-ppn",
            str(s.max_ranks_per_node),
        ]
        assert "--allow-run-as-root" not in cmd  # hydra has no such check
        listed = cmd[cmd.index("-genvlist") + 1].split(",")
        assert listed == ["PATH", "LD_LIBRARY_PATH", *env_names]
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert env["MASTER_ADDR"] == "hpcring-worker-0.hpcring"
    if mpi == "intel-mpi":
        assert env.get("I_MPI_PIN_DOMAIN" if binding else "I_MPI_PIN") == (
            str(s.cpus_per_rank * s.threads_per_core) if binding else "0"
        )
    assert cmd[-2:] == ["python", "train.py"]
    limits = worker["resources"]["limits"]
    assert limits["rdma/rdma_shared_device_a"] == 1
    # Requests = limits for CPU and memory (Guaranteed): the ranks' cores, both hardware threads of each.
    cpus = str(s.max_ranks_per_node * s.cpus_per_rank * prof.node.threads_per_core)
    assert worker["resources"]["requests"] == {"cpu": cpus, "memory": "900Gi"}
    assert {k: limits[k] for k in ("cpu", "memory")} == worker["resources"]["requests"]
    assert (
        launcher["resources"]["requests"] == launcher["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    )
    assert "command" not in worker and "args" not in worker  # the operator's `/usr/sbin/sshd -De`
    assert worker["readinessProbe"]["tcpSocket"] == {"port": 22}
    assert job["launcherCreationPolicy"] == "WaitForWorkersReady"
    if s.gpus_per_rank:
        assert limits["nvidia.com/gpu"] == 8  # the whole node: the profile's GPU numbers are the pod's
        assert "-c" in cmd and cmd[cmd.index("-c") + 2] == "hpcring-affinity"
    else:
        assert "nvidia.com/gpu" not in limits and "hpcring-affinity" not in cmd
    shm = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    assert shm == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
    assert worker["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "securityContext" not in worker and "securityContext" not in launcher  # baseline admits it
    assert job["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 0}


def test_time_namespace_and_pod_options_reach_the_manifest() -> None:
    extra = (
        "    namespace: ml-team\n    ttl_seconds_after_finished: 600\n    node_selector: {pool: a100}\n"
        "    service_account: trainer\n    image_pull_secrets: [regcred]\n    image: default/image:2\n"
    )
    p = plan(variant(extra=extra), nodes=2, time_s=3600, workdir="/workspace", image=None)
    obj = manifest(p)
    assert kubernetes_crd.errors(obj) == []
    assert obj["metadata"]["namespace"] == "ml-team"
    assert obj["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert obj["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 600
    worker_pod = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker_pod["nodeSelector"] == {"pool": "a100"}
    assert worker_pod["serviceAccountName"] == "trainer"
    assert worker_pod["imagePullSecrets"] == [{"name": "regcred"}]
    for role in ("Launcher", "Worker"):
        (c,) = containers(obj, role)
        assert c["image"] == "default/image:2"  # the profile's image when --image is not given
        assert c["workingDir"] == "/workspace"


def _valid() -> dict[str, Any]:
    return kubernetes_manifest.to_object(plan(nodes=2))


def _launcher(obj: dict[str, Any]) -> dict[str, Any]:
    return containers(obj, "Launcher")[0]


BREAKAGES = [
    ("slotsPerWorker as a string", lambda o: o["spec"].update(slotsPerWorker="8"), "spec.slotsPerWorker"),
    ("unknown MPI", lambda o: o["spec"].update(mpiImplementation="MVAPICH"), "spec.mpiImplementation"),
    ("unknown spec field", lambda o: o["spec"].update(slotsPerNode=8), "spec"),
    ("misspelt container field", lambda o: _launcher(o).update(commands=["x"]), "containers[0]"),
    ("container without name", lambda o: _launcher(o).pop("name"), "containers[0]"),
    (
        "replicas as a float",
        lambda o: o["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=1.5),
        "replicas",
    ),
    (
        "bad quantity",
        lambda o: containers(o, "Worker")[0]["resources"]["limits"].update(cpu="lots"),
        "limits.cpu",
    ),
    ("repeated env name", lambda o: _launcher(o)["env"].append(dict(_launcher(o)["env"][0])), "repeats"),
    ("unknown replica type", lambda o: o["spec"]["mpiReplicaSpecs"].update(Master={}), "Master"),
    ("no launcher", lambda o: o["spec"]["mpiReplicaSpecs"].pop("Launcher"), "Launcher"),
    ("bad name", lambda o: o["metadata"].update(name="Train_1"), "metadata.name"),
    ("other API version", lambda o: o.update(apiVersion="kubeflow.org/v1"), "apiVersion"),
    ("env value not a string", lambda o: _launcher(o)["env"][0].update(value=0), "env[0].value"),
]


@pytest.mark.parametrize(("what", "breaks", "path"), BREAKAGES, ids=[b[0] for b in BREAKAGES])
def test_crd_schema_catches_a_broken_manifest(what: str, breaks: Any, path: str) -> None:
    obj = _valid()
    assert kubernetes_crd.errors(obj) == []
    broken = copy.deepcopy(obj)
    breaks(broken)
    found = kubernetes_crd.errors(broken)
    assert any(path in line for line in found), (what, found)
    with pytest.raises(ConfigError, match="does not match the MPIJob CRD"):
        kubernetes_crd.validate(broken)


def test_shipped_crd_schema_states_source_and_licence() -> None:
    doc = kubernetes_crd.crd_document()
    src = doc["x-source"]
    assert src["repository"] == "https://github.com/kubeflow/mpi-operator"
    assert src["license"] == "Apache-2.0" and len(src["commit"]) == 40
    spec = doc["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["mpiImplementation"]["enum"] == ["OpenMPI", "Intel", "MPICH"]
    notice = resources.files("hpcring.schedulers").joinpath("schema", "mpijob.v2beta1.NOTICE").read_text()
    assert src["commit"] in notice and "Apache License, Version 2.0" in notice
    package_data = next(
        line for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("hpcring = [")
    )
    assert '"schedulers/schema/*.NOTICE"' in package_data and '"schedulers/schema/*.json"' in package_data


@pytest.mark.parametrize(("nodes", "ranks", "gpus"), [(1, None, None), (2, 4, 2), (1, 2, 4)])
def test_gpu_wrapper_gives_each_local_rank_its_mapped_gpus(
    tmp_path: Path, nodes: int, ranks: int | None, gpus: int | None
) -> None:
    """The wrapper as the pod runs it (after the kubelet's expansion), under bash, once per local rank with
    Open MPI's, MPICH's and Intel MPI's variable: it exports the rank's GPUs from the mapping, then execs the
    command with its arguments unchanged."""
    p = plan(nodes=nodes, ranks=ranks, gpus_per_rank=gpus, command=("printenv", "CUDA_VISIBLE_DEVICES"))
    cmd = [kubelet_expand(w, {}) for w in _launcher(manifest(p))["command"]]
    start = cmd.index("bash")
    wrapper_argv = cmd[start:]
    rm = mapping.build(profile.load(PROFILE), JobSpec(nodes=nodes, ranks=ranks, gpus_per_rank=gpus))
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "MPI_LOCALRANKID"):
        for slot in rm.slots(0):
            out = subprocess.run(
                wrapper_argv,
                env={"PATH": "/usr/bin:/bin", var: str(slot.local_rank)},
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            assert out.stdout.strip() == ",".join(map(str, slot.gpus))
    beyond = subprocess.run(
        wrapper_argv,
        env={"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_LOCAL_RANK": str(len(rm.slots(0)))},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert beyond.returncode == 2 and "no GPU for this rank" in beyond.stderr


def test_several_steps_run_in_order_through_bash(tmp_path: Path) -> None:
    """The launcher's script for two steps, as the pod runs it, under bash with a stand-in `mpirun` that
    records its argv: one mpirun per step, in order, each with the one-step command line's words exactly."""
    from hpcring.schedulers.job import Step

    steps = (Step(("python", "prep.py")), Step(("python", "train.py", "--lr", "it's $HOME")))
    p = plan(steps=steps, nodes=2, image="img:1")
    cmd = [kubelet_expand(w, {}) for w in _launcher(manifest(p))["command"]]
    assert cmd[:2] == ["bash", "-c"] and len(cmd) == 3
    assert kubernetes_crd.errors(manifest(p)) == []
    record = tmp_path / "record.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(
        bin_dir / "mpirun",
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n",
    )
    run = subprocess.run(
        cmd, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=True
    )
    assert "hpcring: step 2/2" in run.stdout
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    for step, call in zip(steps, calls, strict=True):
        one = plan(command=step.argv, nodes=2, image="img:1").launcher_command
        assert ["mpirun", *call] == list(one)


def test_uneven_ranks_refused_where_the_profile_allows_them() -> None:
    text = profile.source_of(PROFILE)[1].replace("require_even_ranks: true", "require_even_ranks: false")
    with pytest.raises(ConfigError, match="same slotsPerWorker"):
        plan(profile.parse(text, "p.yaml"), nodes=3, ranks=8)


REFUSED = [
    ({"image": None}, "no container image: pass --image"),
    ({"name": "My Job"}, "cannot name an MPIJob"),
    ({"name": "a" * 60, "nodes": 2}, "at most 54 characters"),
    ({"output": "/x/out"}, "--job-output: not supported with kubernetes"),
    ({"partition": "gpu"}, "--partition: not supported with kubernetes"),
    ({"account": "acct"}, "--account: not supported with kubernetes"),
    ({"modules": ("cuda",)}, "--module: not supported with kubernetes"),
]


@pytest.mark.parametrize(("job", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_refused_with_the_reason(job: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        plan(**job)


def _profile_with(replace: tuple[str, str] | None = None, extra: str = "") -> str:
    text = profile.source_of(PROFILE)[1]
    if replace:
        assert replace[0] in text
        text = text.replace(*replace)
    return text + extra


PROFILE_ERRORS = [
    (("scheduler: kubernetes", "scheduler: k8s"), "", "site.scheduler: 'k8s' is not allowed; allowed: "),
    (("clean_pod_policy: Running", "clean_pod_policy: Always"), "", "allowed: 'None', 'Running' or 'All'"),
    (None, "    replicas: 3\n", "unknown key 'replicas'; allowed keys: "),
    (None, "    capabilities: [SYS_ADMIN]\n", "site.kubernetes.capabilities[0]"),
    (("worker_memory: 900Gi", "worker_memory: lots"), "", "site.kubernetes.worker_memory"),
    (("rdma/rdma_shared_device_a: 1", "rdma/rdma_shared_device_a: 0"), "", "rdma_resources"),
    (("shm_size: 64Gi", "shm_size: lots"), "", "site.kubernetes.shm_size"),
    (("mpi: openmpi", "mpi: spectrum-mpi"), "", "allowed with kubernetes: 'openmpi', 'intel-mpi' or 'mpich'"),
    (("launcher: mpirun", "launcher: srun"), "", "cannot launch under kubernetes; allowed: 'mpirun'"),
    (("container: null", "container: {runtime: apptainer}"), "", "site.container: not used with kubernetes"),
    (("scheduler: kubernetes", "scheduler: slurm"), "", "kubernetes options given but the scheduler is"),
]


@pytest.mark.parametrize(("replace", "extra", "message"), PROFILE_ERRORS, ids=[e[2] for e in PROFILE_ERRORS])
def test_profile_kubernetes_fields_validated(
    replace: tuple[str, str] | None, extra: str, message: str
) -> None:
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace("[", r"\[")):
        profile.parse(_profile_with(replace, extra), "p.yaml")


def test_map_shows_the_per_rank_layout(capsys: pytest.CaptureFixture[str]) -> None:
    from hpcring.cli import main

    assert main(["map", "--profile", PROFILE, "--nodes", "2", "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)
    assert len(ranks) == 16
    for r in ranks:
        assert r["node"] == r["rank"] // 8 and r["gpus"] == [r["rank"] % 8]


def test_render_cli_writes_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hpcring.cli import main

    out = tmp_path / "job.yaml"
    argv = [
        "render",
        "--profile",
        PROFILE,
        "--nodes",
        "2",
        "--image",
        "img:1",
        "-o",
        str(out),
        "--",
        "python",
        "t.py",
    ]
    assert main(argv) == 0
    obj = yaml.safe_load(out.read_text())
    assert kubernetes_crd.errors(obj) == [] and obj["kind"] == "MPIJob"
    assert main(["render", "--profile", PROFILE, "--nodes", "2", "--", "python", "t.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no container image" in err[0]


@pytest.mark.parametrize(
    ("vendor", "resource", "variable"),
    [("amd", "amd.com/gpu", "ROCR_VISIBLE_DEVICES"), ("nvidia", "nvidia.com/gpu", "CUDA_VISIBLE_DEVICES")],
)
def test_gpu_resource_and_visibility_follow_the_vendor(vendor: str, resource: str, variable: str) -> None:
    """Without site.kubernetes.gpu_resource, the vendor's usual device-plugin resource is asked for."""
    text = profile.source_of(PROFILE)[1].replace("gpu_vendor: nvidia", f"gpu_vendor: {vendor}")
    text = text.replace("    gpu_resource: nvidia.com/gpu\n", "")
    obj = manifest(plan(profile.parse(text, "p.yaml"), nodes=2))
    assert kubernetes_crd.errors(obj) == []
    assert containers(obj, "Worker")[0]["resources"]["limits"][resource] == 8
    wrapper = containers(obj, "Launcher")[0]["command"]
    assert any(f'export {variable}="$$devices"' in word for word in wrapper)


def test_worker_memory_is_required_to_render() -> None:
    """Without it a namespace's LimitRange default (often far below a training job's need) would apply."""
    text = profile.source_of(PROFILE)[1].replace("    worker_memory: 900Gi\n", "")
    with pytest.raises(ConfigError, match=r"site\.kubernetes\.worker_memory is not set"):
        plan(profile.parse(text, "p.yaml"), nodes=2)


@pytest.mark.parametrize("path", ["/home/hpc/.ssh", "/root/.ssh/"])
def test_root_follows_the_ssh_mount_path(path: str) -> None:
    """/root/.ssh (the operator's default, compared exactly by it): pods run as root, so Open MPI gets
    --allow-run-as-root and the workers a probe on root's sshd. Any other home: neither."""
    text = profile.source_of(PROFILE)[1].replace(
        "ssh_auth_mount_path: /root/.ssh", f"ssh_auth_mount_path: {path}"
    )
    obj = manifest(plan(profile.parse(text, "p.yaml"), nodes=2))
    assert kubernetes_crd.errors(obj) == []
    root = path.startswith("/root/")
    assert obj["spec"]["sshAuthMountPath"] == path.rstrip("/")
    assert ("--allow-run-as-root" in _launcher(obj)["command"]) is root
    assert ("readinessProbe" in containers(obj, "Worker")[0]) is root


def test_capabilities_only_when_the_profile_asks() -> None:
    obj = manifest(plan(variant(extra="    capabilities: [IPC_LOCK]\n"), nodes=2))
    assert kubernetes_crd.errors(obj) == []
    for role in ("Launcher", "Worker"):
        assert containers(obj, role)[0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_golden_mpijob() -> None:
    """The whole manifest of the built-in template (2 nodes, Open MPI) as reviewed, in
    golden/generic-k8s-gpu-mpijob.yaml. `HPCRING_UPDATE_GOLDEN=1` rewrites it after an intended change (the
    profile's digest is in it)."""
    text = kubernetes_manifest.render(plan(nodes=2, image="registry.example/hpcring:mpijob"))
    golden = ROOT / "tests" / "schedulers" / "golden" / "generic-k8s-gpu-mpijob.yaml"
    if os.environ.get("HPCRING_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"missing golden file {golden}; run with HPCRING_UPDATE_GOLDEN=1"
    assert text == golden.read_text()
