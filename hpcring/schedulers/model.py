"""The cluster model: frozen dataclasses built from a validated profile.

Everything downstream (mapping, plans, templates) reads these objects and never the raw YAML, so a profile is
checked once and the rest of the code can trust its invariants (e.g. every GPU's NUMA domain exists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Interconnect = Literal["infiniband", "roce", "slingshot", "ethernet"]
Visibility = Literal["isolated", "shared"]
ThreadNumbering = Literal["compact", "scatter"]

INTERCONNECTS: tuple[str, ...] = ("infiniband", "roce", "slingshot", "ethernet")
VISIBILITIES: tuple[str, ...] = ("isolated", "shared")
THREAD_NUMBERINGS: tuple[str, ...] = ("compact", "scatter")
SCHEDULERS: tuple[str, ...] = ("slurm", "lsf", "pbs", "flux", "kubernetes")
LAUNCHERS: tuple[str, ...] = ("srun", "jsrun", "mpirun", "mpiexec", "flux")
# Which launchers can start ranks under which scheduler: mpirun wherever Open MPI has a plugin for the
# scheduler's own start-up (Slurm, LSF, PBS TM); Flux starts MPI jobs through `flux run` and its PMI.
LAUNCHERS_OF: dict[str, tuple[str, ...]] = {
    "slurm": ("srun", "mpirun"),
    "lsf": ("jsrun", "mpirun"),
    "pbs": ("mpiexec", "mpirun"),
    "flux": ("flux",),
    # Kubernetes: the MPI Operator's launcher pod runs mpirun (Open MPI, MPICH or Intel MPI) over its workers.
    "kubernetes": ("mpirun",),
}
RUNTIMES: tuple[str, ...] = ("singularity", "apptainer", "container-engine")
GPU_VENDORS: tuple[str, ...] = ("nvidia", "amd", "intel")


@dataclass(frozen=True)
class NumaDomain:
    """A NUMA domain and the physical cores (not hardware threads) it holds."""

    id: int
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Gpu:
    """One GPU (or AMD GCD) as the node numbers it, with its locality."""

    index: int  # the node's numbering (CUDA/ROCm device id): what `gpus` in the mapping lists
    numa: int
    closest_cores: tuple[int, ...]  # physical cores with the shortest path to this GPU
    scheduler_index: int  # how Slurm/LSF number it in map_gpu / ERF (often equal to `index`)
    device: int | None = None  # the physical GPU when this entry is one of its tiles (Intel Max stacks)
    tile: int | None = None  # tile number inside `device`
    apu: bool = False  # shares package and memory with the cores of its NUMA domain (MI300A)

    @property
    def tile_id(self) -> str | None:
        """`DEVICE.TILE` as Level Zero's ZE_AFFINITY_MASK and mpiexec --gpu-bind=list spell a tile."""
        return None if self.tile is None else f"{self.device}.{self.tile}"


@dataclass(frozen=True)
class Nic:
    """A network interface; `numa` is None where the site does not document it."""

    name: str
    numa: int | None
    gpus: tuple[int, ...] = ()  # GPU indexes the NIC is attached to directly (one rank owning them gets it)


@dataclass(frozen=True)
class Node:
    """One compute node's topology; all nodes of a profile are identical."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int
    thread_numbering: ThreadNumbering
    reserved_cores: frozenset[int]
    numa: tuple[NumaDomain, ...]
    gpus: tuple[Gpu, ...]
    gpu_vendor: str
    gpu_visibility: Visibility
    nics: tuple[Nic, ...]
    interconnect: Interconnect

    @property
    def cores(self) -> int:
        """Physical cores per node, reserved ones included."""
        return self.sockets * self.cores_per_socket

    @property
    def usable_cores(self) -> tuple[int, ...]:
        """Cores a job may bind to (everything but the reserved / specialised ones)."""
        return tuple(c for c in range(self.cores) if c not in self.reserved_cores)

    def hw_threads(self, core: int, count: int | None = None) -> tuple[int, ...]:
        """OS numbers of the first `count` hardware threads of `core` (all of them by default).

        compact: core c owns threads c*T .. c*T+T-1 (POWER9 on Summit);
        scatter: core c owns c, c+C, c+2C, ... with C cores per node (x86 Linux, Frontier, Perlmutter).
        """
        n = self.threads_per_core if count is None else count
        if self.thread_numbering == "compact":
            return tuple(core * self.threads_per_core + t for t in range(n))
        return tuple(core + t * self.cores for t in range(n))

    def numa_of_core(self, core: int) -> int | None:
        """NUMA domain holding `core`, None if the profile leaves it out."""
        for dom in self.numa:
            if core in dom.cores:
                return dom.id
        return None

    def socket_of_core(self, core: int) -> int:
        """Socket index of a physical core (cores are numbered socket by socket)."""
        return core // self.cores_per_socket


@dataclass(frozen=True)
class Partition:
    """A partition (Slurm), QOS (Slurm) or queue (LSF) with its walltime and size limits."""

    name: str
    max_walltime_s: int
    max_nodes: int | None = None
    default: bool = False
    min_nodes: int = 1  # the site's documented minimum job size for the queue
    selector: str = "partition"  # slurm: "partition" or "qos"; lsf: always the queue (-q)
    # (max_nodes, max_walltime_s) bins, smallest first: a job of n nodes gets the first bin with n <=
    # max_nodes.
    walltime_bins: tuple[tuple[int, int], ...] = ()

    def walltime_limit(self, nodes: int) -> int:
        """Walltime limit in seconds for a job of `nodes` nodes (sites often scale it with job size)."""
        for max_nodes, limit in self.walltime_bins:
            if nodes <= max_nodes:
                return limit
        return self.max_walltime_s


MPI_ABIS: tuple[str, ...] = ("mpich", "openmpi")
# The soname an MPI of each ABI family provides (MPICH ABI initiative: libtool version 12; Open MPI >= 3: 40).
LIBMPI_SONAME: dict[str, str] = {"mpich": "libmpi.so.12", "openmpi": "libmpi.so.40"}
# Which host MPI (`site.mpi`) belongs to which ABI family. Spectrum MPI is Open MPI-derived but ships
# libmpi_ibm.so, so neither family's soname exists on such a host.
ABI_OF_SITE_MPI: dict[str, str] = {
    "mpich": "mpich",
    "cray-mpich": "mpich",
    "intel-mpi": "mpich",
    "openmpi": "openmpi",
}


@dataclass(frozen=True)
class HostMpi:
    """The bind model: the host's MPI library replaces the image's at run time (ABI-compatible sonames).

    Paths may hold `${NAME}` references to the job's environment (e.g. `${CRAY_MPICH_ROOTDIR}`, set by the
    site's modules): they are expanded by the job script on the first node, never by hpcring.
    """

    abi: str  # "mpich" (libmpi.so.12) or "openmpi" (libmpi.so.40)
    modules: tuple[str, ...] = ()  # loaded only for container jobs (e.g. cray-mpich-abi)
    binds: tuple[str, ...] = ()  # host directories bound at the same path (MPI prefix, PMI sockets)
    libs: tuple[str, ...] = ()  # single host libraries the MPI needs, bound into HOST_LIBS_DIR
    lib_dirs: tuple[str, ...] = ()  # container paths put first on LD_LIBRARY_PATH
    preload: tuple[str, ...] = ()  # LD_PRELOAD inside the container (e.g. Cray's GPU transport layer)

    @property
    def soname(self) -> str:
        return LIBMPI_SONAME[self.abi]


@dataclass(frozen=True)
class Container:
    """How the site runs images: runtime, binds, devices, environment and (optionally) the host MPI."""

    runtime: str
    binds: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # e.g. /dev/infiniband: bound at the same path
    env: tuple[tuple[str, str], ...] = ()  # --env NAME=VALUE
    host_mpi: HostMpi | None = None
    # What the site's documentation does before the runtime can start, only for container jobs: `module use`
    # directories, modules that put the runtime on PATH, and batch directives (ALCF: `-l
    # singularity_fakeroot=true`, without which its required --fakeroot fails).
    module_paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    directives: tuple[str, ...] = ()
    lib_dirs: tuple[str, ...] = ()  # hybrid model: container paths put first on LD_LIBRARY_PATH
    # CSCS Container Engine only: the EDF's [annotations] (hooks, e.g. com.hooks.aws_ofi_nccl.enabled).
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SlurmOptions:
    """Slurm specifics: core specialisation, constraint, GPU binding style, PMI plugin."""

    core_spec: int | None = None
    constraint: str | None = None
    # "map": map_gpu/mask_gpu from the mapping; "closest": Slurm picks; "none"; "wrapper": --gpus-per-node
    # and the per-rank wrapper sets the visibility variable from SLURM_LOCALID (LUMI's select_gpu).
    gpu_bind: str = "map"
    mpi: str | None = None  # srun --mpi=...
    exclusive: bool = False
    extra_directives: tuple[str, ...] = ()


@dataclass(frozen=True)
class LsfOptions:
    """LSF specifics: -alloc_flags and whether host 0 of an ERF is the launch node (Summit, CSM)."""

    alloc_flags: tuple[str, ...] = ()
    launch_node: bool = False
    extra_directives: tuple[str, ...] = ()


@dataclass(frozen=True)
class PbsOptions:
    """PBS Pro / OpenPBS specifics (`site.pbs`, schema v2): the chunk request and the site's `mpiexec`."""

    mpiexec: str | None = None  # "pals" (Cray) or "hydra" (MPICH); None: pals with cray-mpich, else hydra
    place: str = "scatter"  # -l place=...: one chunk per node
    filesystems: tuple[str, ...] = ()  # -l filesystems=a:b (ALCF requires it)
    ncpus: int | Literal[False] | None = (
        None  # ncpus of a chunk; None: every hardware thread; False: left out
    )
    ngpus: bool = True  # ask for the node's (physical) GPUs in the chunk
    select: tuple[tuple[str, str], ...] = ()  # extra chunk resources, e.g. system=polaris
    keep: str | None = None  # -k (e.g. "doe": write output straight to its final place)
    extra_directives: tuple[str, ...] = ()


@dataclass(frozen=True)
class FluxOptions:
    """Flux specifics (`site.flux`, schema v2): exclusive nodes, job attributes, how `flux run` binds."""

    exclusive: bool = True  # --exclusive on `flux batch` and `flux run`: whole nodes
    setattr: tuple[tuple[str, str], ...] = ()  # --setattr=KEY=VALUE job attributes
    cpu_affinity: str = "per-task"  # -o cpu-affinity=...
    gpu_affinity: str = "per-task"  # -o gpu-affinity=...
    extra_directives: tuple[str, ...] = ()


@dataclass(frozen=True)
class KubernetesOptions:
    """Kubernetes specifics (`site.kubernetes`): what the MPIJob's pods ask the cluster for."""

    namespace: str | None = None
    image: str | None = None  # default container image (`--image` overrides)
    gpu_resource: str | None = None  # device-plugin resource name; None: the vendor's usual one
    rdma_resources: tuple[tuple[str, int], ...] = ()  # device-plugin resources per worker pod
    shm_size: str | None = None  # sizeLimit of the memory-backed /dev/shm
    capabilities: tuple[str, ...] = ()  # added to the containers (IPC_LOCK for RDMA memory registration)
    worker_memory: str | None = None  # memory request and limit of a worker pod (required to render)
    ssh_auth_mount_path: str = "/root/.ssh"
    clean_pod_policy: str = "Running"
    backoff_limit: int | None = None
    ttl_seconds_after_finished: int | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Network:
    """The site's documented network stack for GPU collectives (`site.network`): the OFI plugin for
    NCCL/RCCL (modules, library paths, directives) and the variables the site gives for it; applied to jobs
    whose ranks use GPUs, in place of the interconnect's generic defaults (interconnect.py)."""

    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    library_paths: tuple[str, ...] = ()  # host path expressions put first on LD_LIBRARY_PATH
    directives: tuple[str, ...] = ()  # batch directives in the scheduler's syntax
    # GPU-aware MPI: its variables, set only when the rank program is known to link the MPI's GPU transfer
    # library (Cray MPICH aborts at start otherwise); `gpu_aware_mpi` says it is (a job may say so too).
    gpu_aware_env: tuple[tuple[str, str], ...] = ()
    gpu_aware_mpi: bool = False


@dataclass(frozen=True)
class Retired:
    """A system its site has taken out of service: profiles list marks it, scripts render with a warning."""

    date: str
    source: str


@dataclass(frozen=True)
class Site:
    """Everything about a site that is not the node: scheduler, launcher, limits, software environment."""

    scheduler: str
    launcher: str
    mpi: str
    partitions: tuple[Partition, ...]
    account: str | None
    account_required: bool
    modules: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    smt: int  # hardware threads per core a rank uses by default
    require_even_ranks: bool
    binding: bool  # False: launch without CPU binding (emulated clusters, over-declared CPUs)
    container: Container | None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    lsf: LsfOptions = field(default_factory=LsfOptions)
    pbs: PbsOptions = field(default_factory=PbsOptions)
    flux: FluxOptions = field(default_factory=FluxOptions)
    kubernetes: KubernetesOptions = field(default_factory=KubernetesOptions)
    # With no container: why (the site's documentation, cited), so that --image is refused with the reason.
    no_container_reason: str | None = None
    # "gpu": local rank i takes GPU i; "cores": local ranks numbered in core order (the slots are the same).
    rank_order: str = "gpu"
    network: Network | None = None

    def partition(self, name: str | None) -> Partition | None:
        """The named partition, else the default one, else the first; None when the site lists none."""
        if name is not None:
            for p in self.partitions:
                if p.name == name:
                    return p
            return None
        for p in self.partitions:
            if p.default:
                return p
        return self.partitions[0] if self.partitions else None


@dataclass(frozen=True)
class Profile:
    """A validated cluster profile; `digest` is the SHA-256 of its source text (provenance header)."""

    name: str
    description: str
    node: Node
    site: Site
    source: str
    digest: str
    retired: Retired | None = None

    @property
    def retired_warning(self) -> str | None:
        """One line for scripts and stderr when the system is retired, else None."""
        if self.retired is None:
            return None
        return (
            f"profile {self.name!r} describes a retired system (out of service since {self.retired.date}, "
            f"{self.retired.source}); its jobs cannot run there"
        )
