"""The MPIJob plan: every number, name and command line of a Kubernetes job, as data.

Like `planner` for batch scripts, this module alone computes; `kubernetes_manifest` only formats. One worker
pod per node (replicas = nodes) with `slotsPerWorker` ranks each, taking all the node's GPUs so that the GPU
numbers of the profile are the ones the pod sees; the launcher pod runs mpirun, and every rank starts through
hpcring's per-rank GPU wrapper (the one `mpiexec` uses), which keeps only the rank's own GPUs visible.

What the operator adds to the pods (the hostfile at /etc/mpi, the SSH Secret, the workers' sshd, the
launcher's environment) is in docs/dev/kubernetes.md, read from its controller; the mpirun line relies on the
first two only, since Open MPI 5 ignores the `OMPI_MCA_orte_*` variables the operator sets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpcring.errors import ConfigError, choices
from hpcring.schedulers import planner, registry
from hpcring.schedulers.job import JobSpec, describe
from hpcring.schedulers.kubernetes_options import MPI_IMPLEMENTATIONS
from hpcring.schedulers.launchers import mpiexec_affinity
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.shell import join
from hpcring.version import __version__

# Open MPI's, MPICH hydra's and Intel MPI's local rank variables (the ranks mpirun starts in worker pods).
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "MPI_LOCALRANKID")
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "gpu.intel.com/i915"}
WRAPPER_NAME = "hpcring-affinity"  # $0 of the wrapper's `bash -c`
# The job name is the Service's (DNS-1035 label) and prefixes the pods' host names (at most 63 characters).
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_LABEL = 63
# The hostfile of the operator's ConfigMap, mounted in the launcher pod; passed to mpirun explicitly.
HOSTFILE = "/etc/mpi/hostfile"
# The operator's default sshAuthMountPath; there the pods (and so mpirun and the ranks) run as root.
ROOT_SSH = "/root/.ssh"
# The image's own variables that ranks on other pods need (ssh sessions start with sshd's environment).
IMAGE_ENV = ("PATH", "LD_LIBRARY_PATH")
SSH_PORT = 22  # where the workers' `/usr/sbin/sshd -De` listens: the readiness probe's port


@dataclass(frozen=True)
class MpiJobPlan:
    """What `kubernetes_manifest` formats."""

    name: str
    namespace: str | None
    profile: str
    digest: str
    version: str
    summary: str
    image: str
    mpi_implementation: str
    workers: int
    slots_per_worker: int
    launcher_command: tuple[str, ...]  # the launcher container's command: mpirun ... (or bash -c for steps)
    env: tuple[tuple[str, str], ...]
    worker_resources: tuple[tuple[str, int], ...]  # device-plugin resources per worker pod (limits)
    worker_requests: tuple[tuple[str, str], ...]  # cpu and memory per worker pod (requests = limits)
    ssh_port: int | None  # the workers' readiness probe (root's sshd); None: the image's own sshd set-up
    shm_size: str | None
    capabilities: tuple[str, ...]
    ssh_auth_mount_path: str
    clean_pod_policy: str
    backoff_limit: int | None
    ttl_seconds_after_finished: int | None
    active_deadline_s: int | None
    node_selector: tuple[tuple[str, str], ...]
    service_account: str | None
    image_pull_secrets: tuple[str, ...]
    workdir: str | None
    wrapper: str | None  # the per-rank GPU wrapper's text, None when ranks need none


def first_worker(name: str) -> str:
    """DNS name of worker 0: the operator gives pods the job's Service as subdomain."""
    return f"{name}-worker-0.{name}"


def check_name(name: str, workers: int) -> None:
    """The job name must be a DNS-1035 label and leave room for `-worker-N` in the pods' host names."""
    longest = len(name) + len(f"-worker-{workers - 1}")
    if not _NAME.match(name) or longest > _MAX_LABEL:
        room = _MAX_LABEL - len(f"-worker-{workers - 1}")
        raise ConfigError(
            f"job name {name!r} cannot name an MPIJob: use --job-name with lowercase letters, digits and "
            f"'-', starting with a letter and ending with a letter or digit, at most {room} characters"
        )


def _refuse_batch_only(job: JobSpec, rm: RankMap) -> None:
    """Job-script settings with no meaning in a pod: refused, saying what to use instead."""
    site = rm.profile.site
    unsupported = (
        ("--account", job.account, "Kubernetes has no accounts; quotas are per namespace"),
        ("--partition", job.partition, "choose nodes with site.kubernetes.node_selector"),
        ("--job-output", job.output, "the launcher's output is `kubectl logs`"),
        ("--job-error", job.error, "the launcher's output is `kubectl logs`"),
        ("--bind", job.binds, "mount volumes in the pods instead"),
        (
            "--module",
            job.modules or site.modules,
            "a pod has no module system: put the software in the image",
        ),
        ("elastic", job.elastic, "the MPI Operator restarts whole jobs (runPolicy.backoffLimit)"),
        (
            "--requeue-on-limit",
            job.requeue,
            "an MPIJob has no time limit to warn of (no wall clock to outlive)",
        ),
    )
    for flag, value, why in unsupported:
        if value:
            raise ConfigError(f"{flag}: not supported with kubernetes: {why}")


def _extra_env(rm: RankMap) -> list[tuple[str, str]]:
    """Variables the site's MPI reads for placement: Intel MPI pins by variables, a domain of the rank's
    cores' hardware threads."""
    site, s = rm.profile.site, rm.shape
    if site.mpi != "intel-mpi":
        return []
    if site.binding:
        return [("I_MPI_PIN_DOMAIN", str(s.cpus_per_rank * s.threads_per_core))]
    return [("I_MPI_PIN", "0")]


def mpirun_flags(rm: RankMap, env_names: list[str], root: bool) -> list[str]:
    """mpirun's words for the site's MPI: the operator's hostfile, the rank count and placement, root's
    consent (Open MPI), and the variables each rank must get (`env_names` after the image's PATH and
    LD_LIBRARY_PATH, since ranks on other pods start from an ssh session's environment).

    The kubelet, not the job, picks a pod's CPUs, so ranks are bound by the MPI inside the pod's own cpuset
    (`cpus_per_rank` cores each) instead of by the profile's OS numbers.
    """
    site, s = rm.profile.site, rm.shape
    n, ppn, cores = str(s.ranks), str(s.max_ranks_per_node), s.cpus_per_rank
    names = [*IMAGE_ENV, *(k for k in env_names if k not in IMAGE_ENV)]
    if site.mpi == "openmpi":
        # PRRTE (Open MPI 5) reads no OMPI_MCA_orte_default_hostfile: the hostfile goes on the command line.
        head = ["mpirun", "--hostfile", HOSTFILE, *(["--allow-run-as-root"] if root else []), "-n", n]
        forward = [w for name in names for w in ("-x", name)]
        if site.binding:
            return [*head, "--map-by", f"ppr:{ppn}:node:PE={cores}", "--bind-to", "core", *forward]
        return [*head, "--map-by", f"ppr:{ppn}:node", "--bind-to", "none", *forward]
    # MPICH's and Intel MPI's hydra: -genvlist forwards these alone, not the launcher pod's whole environment.
    head = ["mpirun", "-f", HOSTFILE, "-n", n, "-ppn", ppn]
    forward = ["-genvlist", ",".join(names)]
    if site.mpi == "mpich":
        return [*head, "-bind-to", f"core:{cores}" if site.binding else "none", *forward]
    return [*head, *forward]  # Intel MPI: pinning by the variables of _extra_env


def worker_requests(rm: RankMap, memory: str) -> tuple[tuple[str, str], ...]:
    """A worker pod's CPU and memory, as requests and limits alike (Guaranteed QoS, which the kubelet's static
    CPU manager needs to give the pod whole cores): the cores its ranks bind to, counted in Kubernetes CPUs
    (hardware threads; the kubelet hands out whole cores, siblings included)."""
    s, node = rm.shape, rm.profile.node
    cpus = s.max_ranks_per_node * s.cpus_per_rank * node.threads_per_core
    return (("cpu", str(cpus)), ("memory", memory))


def _gpu_count(rm: RankMap) -> int:
    """Physical GPUs of the node (tiles of one device count once): a worker pod takes them all."""
    gpus = rm.profile.node.gpus
    return len({g.device if g.device is not None else g.index for g in gpus})


def build(rm: RankMap, job: JobSpec, image: str | None = None) -> MpiJobPlan:
    """The MPIJob plan for `job` placed as `rm`."""
    profile = rm.profile
    site, k8s, s = profile.site, profile.site.kubernetes, rm.shape
    if site.scheduler != "kubernetes":
        raise ConfigError(f"profile {profile.name!r} schedules with {site.scheduler}, not kubernetes")
    if not job.steps:
        raise ConfigError(
            "nothing to run: give a command after '--', --step lines, or command/steps in --job"
        )
    _refuse_batch_only(job, rm)
    check_name(job.name, s.nodes)
    if not s.even:
        raise ConfigError(
            f"{s.ranks} ranks do not divide evenly over {s.nodes} node(s): an MPIJob gives every worker the "
            "same slotsPerWorker; pass --ranks as a multiple of --nodes"
        )
    img = image or job.image or k8s.image
    if not img:
        raise ConfigError(
            f"no container image: pass --image (or HPCRING_IMAGE, or 'image:' in the job file) or set "
            f"site.kubernetes.image in profile {profile.name!r}; the launcher and workers run it"
        )
    if site.mpi not in MPI_IMPLEMENTATIONS:
        raise ConfigError(f"site.mpi {site.mpi!r} cannot run here; allowed: {choices(MPI_IMPLEMENTATIONS)}")
    if not k8s.worker_memory:
        raise ConfigError(
            f"profile {profile.name!r}: site.kubernetes.worker_memory is not set: give the memory a worker "
            "pod may use (a Kubernetes quantity such as 200Gi), its request and limit"
        )
    env = planner.job_env(rm, job, registry.scheduler("kubernetes"))
    env = [(k, first_worker(job.name) if k == "MASTER_ADDR" else v) for k, v in env]
    env += _extra_env(rm)
    root = k8s.ssh_auth_mount_path.rstrip("/") == ROOT_SSH
    launch = mpirun_flags(rm, [k for k, _ in env], root)
    wrapper = mpiexec_affinity.script(rm, LOCAL_RANK_VARS) if mpiexec_affinity.needed(rm) else None
    prefix = ["bash", "-c", wrapper, WRAPPER_NAME] if wrapper else []
    argvs = [[*launch, *prefix, *step.argv] for step in job.steps]
    resources: list[tuple[str, int]] = []
    if s.gpus_per_rank > 0:
        vendor = profile.node.gpu_vendor
        resources.append((k8s.gpu_resource or GPU_RESOURCES.get(vendor, f"{vendor}.com/gpu"), _gpu_count(rm)))
    resources += list(k8s.rdma_resources)
    summary = (
        f"{s.nodes} worker pod(s) x {s.max_ranks_per_node} slot(s) = {s.ranks} ranks, "
        f"{s.gpus_per_rank} GPU(s) and {s.cpus_per_rank} core(s) per rank, "
        f"mpirun ({MPI_IMPLEMENTATIONS[site.mpi]})"
    )
    return MpiJobPlan(
        name=job.name,
        namespace=k8s.namespace,
        profile=profile.name,
        digest=profile.digest,
        version=__version__,
        summary=summary,
        image=img,
        mpi_implementation=MPI_IMPLEMENTATIONS[site.mpi],
        workers=s.nodes,
        slots_per_worker=s.max_ranks_per_node,
        launcher_command=_launcher_command(argvs, [describe(step) for step in job.steps]),
        env=tuple(dict(env).items()),
        worker_resources=tuple(resources),
        worker_requests=worker_requests(rm, k8s.worker_memory),
        ssh_port=SSH_PORT if root else None,
        shm_size=k8s.shm_size,
        capabilities=k8s.capabilities,
        ssh_auth_mount_path=k8s.ssh_auth_mount_path,
        clean_pod_policy=k8s.clean_pod_policy,
        backoff_limit=k8s.backoff_limit,
        ttl_seconds_after_finished=k8s.ttl_seconds_after_finished,
        active_deadline_s=job.time_s,
        node_selector=k8s.node_selector,
        service_account=k8s.service_account,
        image_pull_secrets=k8s.image_pull_secrets,
        workdir=job.workdir,
        wrapper=wrapper,
    )


def _launcher_command(argvs: list[list[str]], labels: list[str]) -> tuple[str, ...]:
    """One step: mpirun's argv as it is. Several: a `bash -c` script running them in order, stopping at the
    first failure, each word quoted for bash."""
    if len(argvs) == 1:
        return tuple(argvs[0])
    lines = ["set -euo pipefail"]
    for i, (argv, label) in enumerate(zip(argvs, labels, strict=True), 1):
        lines.append(join(["echo", f"hpcring: step {i}/{len(argvs)}: {label}"]))
        lines.append(join(argv))
    return ("bash", "-c", "\n".join(lines) + "\n")
