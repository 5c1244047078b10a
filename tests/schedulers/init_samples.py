"""Recorded inputs for `hpcring profiles init` tests: a /sys tree builder and tool outputs written in each
tool's documented format (sources in each constant's comment)."""

from __future__ import annotations

from pathlib import Path

from hpcring.schedulers import cpuset


def sys_tree(
    root: Path,
    *,
    sockets: int,
    cores_per_socket: int,
    threads: int,
    numa: list[str],
    ib: dict[str, int] | None = None,
    link_layer: str = "InfiniBand",
    net: dict[str, int | None] | None = None,
) -> Path:
    """A /sys tree as Linux lays it out (scatter numbering: core c owns CPUs c, c+N, ...)."""
    ncores = sockets * cores_per_socket
    cpu = root / "devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(f"0-{ncores * threads - 1}\n")
    for t in range(threads):
        for c in range(ncores):
            topo = cpu / f"cpu{c + t * ncores}" / "topology"
            topo.mkdir(parents=True)
            (topo / "physical_package_id").write_text(f"{c // cores_per_socket}\n")
            (topo / "core_id").write_text(f"{c % cores_per_socket}\n")
    for i, cores in enumerate(numa):
        node = root / f"devices/system/node/node{i}"
        node.mkdir(parents=True)
        cpus = [c + t * ncores for c in cpuset.parse(cores) for t in range(threads)]
        (node / "cpulist").write_text(cpuset.format_list(sorted(cpus)) + "\n")
    for name, node_id in (ib or {}).items():
        dev = root / "class/infiniband" / name
        (dev / "device").mkdir(parents=True)
        (dev / "device/numa_node").write_text(f"{node_id}\n")
        (dev / "ports/1").mkdir(parents=True)
        (dev / "ports/1/link_layer").write_text(f"{link_layer}\n")
    for name, node_id in (net or {}).items():
        dev = root / "class/net" / name
        (dev / "device").mkdir(parents=True)
        (dev / "device/uevent").write_text("DRIVER=test\n")
        (dev / "type").write_text("1\n")
        if node_id is not None:
            (dev / "device/numa_node").write_text(f"{node_id}\n")
    lo = root / "class/net/lo"  # no device behind it: never a NIC
    lo.mkdir(parents=True)
    (lo / "type").write_text("772\n")
    return root


# `nvidia-smi topo -m` (tab separated; header, one row per GPU and NIC, legends), as NVIDIA drivers print it
# with a "GPU NUMA ID" column and a NIC Legend. Two sockets of 4 cores x 2 threads: socket 0 is CPUs 0-3,8-11.
NVIDIA_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV12\tNV12\tNV12\tPXB\tSYS\t0-3,8-11\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tNV12\tNV12\tPXB\tSYS\t0-3,8-11\t0\t\tN/A\n"
    "GPU2\tNV12\tNV12\t X \tNV12\tSYS\tPXB\t4-7,12-15\t1\t\tN/A\n"
    "GPU3\tNV12\tNV12\tNV12\t X \tSYS\tPXB\t4-7,12-15\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n"
    "\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n"
)

# `scontrol show config` ("Key = Value" lines under a header), `scontrol show partition` (one record per
# partition), as Slurm 23.x prints them.
SCONTROL_CONFIG = (
    "Configuration data as of 2026-11-24T10:00:00\n"
    "AccountingStorageType   = accounting_storage/slurmdbd\n"
    "ClusterName             = gpucluster\n"
    "MpiDefault              = pmix\n"
    "SelectType              = select/cons_tres\n"
    "SLURM_VERSION           = 23.11.4\n"
)
SCONTROL_PARTITION = """PartitionName=batch
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=YES QoS=N/A
   DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO
   MaxNodes=64 MaxTime=2-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=gpu[001-128]
   State=UP TotalCPUs=2048 TotalNodes=128 SelectTypeParameters=NONE

PartitionName=debug
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=NO QoS=N/A
   MaxNodes=2 MaxTime=00:30:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=gpu[001-004]
   State=UP TotalCPUs=64 TotalNodes=4 SelectTypeParameters=NONE

PartitionName=long
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=NO QoS=N/A
   MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=gpu[001-128]
   State=UP TotalCPUs=2048 TotalNodes=128 SelectTypeParameters=NONE
"""
# `sinfo --noheader --format=%P|%l|%D`: the default partition carries a `*`.
SINFO = "batch*|2-00:00:00|128\ndebug|30:00|4\nlong|infinite|128\n"

# `rocm-smi --showtoponuma`, as LUMI's distribution-binding page prints it (8 GCDs on 4 NUMA nodes).
ROCM_TOPONUMA = """====================== Numa Nodes ======================
GPU[0]          : (Topology) Numa Node: 3
GPU[0]          : (Topology) Numa Affinity: 3
GPU[1]          : (Topology) Numa Node: 3
GPU[1]          : (Topology) Numa Affinity: 3
GPU[2]          : (Topology) Numa Node: 1
GPU[2]          : (Topology) Numa Affinity: 1
GPU[3]          : (Topology) Numa Node: 1
GPU[3]          : (Topology) Numa Affinity: 1
GPU[4]          : (Topology) Numa Node: 0
GPU[4]          : (Topology) Numa Affinity: 0
GPU[5]          : (Topology) Numa Node: 0
GPU[5]          : (Topology) Numa Affinity: 0
GPU[6]          : (Topology) Numa Node: 2
GPU[6]          : (Topology) Numa Affinity: 2
GPU[7]          : (Topology) Numa Node: 2
GPU[7]          : (Topology) Numa Affinity: 2
================= End of ROCm SMI Log ==================
"""

# `qstat -Qf` (PBS Pro: "Queue: NAME", indented "key = value", long values continued on a tab-indented
# line) and `qstat -Bf` (the server, with default_queue); limits as ALCF Polaris reports them.
QSTAT_QF = """Queue: debug
    queue_type = Execution
    total_jobs = 3
    state_count = Transit:0 Queued:1 Held:0 Waiting:0 Running:2 Exiting:0 Beg
\tun:0
    resources_max.nodect = 2
    resources_max.walltime = 01:00:00
    resources_min.nodect = 1
    resources_min.walltime = 00:05:00
    enabled = True
    started = True

Queue: prod
    queue_type = Route
    resources_max.nodect = 496
    resources_max.walltime = 24:00:00
    resources_min.nodect = 10
    enabled = True
    started = True

Queue: workq
    queue_type = Execution
    enabled = True
    started = True
"""
QSTAT_BF = """Server: pbs01
    server_state = Active
    server_host = pbs01.example.org
    default_queue = debug
    max_array_size = 1000
"""

# `flux resource list` (flux-resource(1)): STATE NNODES NCORES NGPUS NODELIST.
FLUX_RESOURCES = """     STATE NNODES   NCORES    NGPUS NODELIST
      free      2       16        0 node[1-2]
 allocated      0        0        0
      down      0        0        0
"""

# `lstopo --of xml` (hwloc 2 XML: nested Package/NUMANode/Core/PU objects with os_index and cpuset), for one
# package of 4 cores x 2 threads (PUs c and c+4).
LSTOPO_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x000000ff" nodeset="0x00000001">
    <object type="Package" os_index="0" cpuset="0x000000ff" nodeset="0x00000001">
      <object type="NUMANode" os_index="0" cpuset="0x000000ff" nodeset="0x00000001" local_memory="1024"/>
      <object type="L3Cache" cpuset="0x000000ff" cache_size="1048576" depth="3">
        <object type="Core" os_index="0" cpuset="0x00000011">
          <object type="PU" os_index="0" cpuset="0x00000001"/>
          <object type="PU" os_index="4" cpuset="0x00000010"/>
        </object>
        <object type="Core" os_index="1" cpuset="0x00000022">
          <object type="PU" os_index="1" cpuset="0x00000002"/>
          <object type="PU" os_index="5" cpuset="0x00000020"/>
        </object>
        <object type="Core" os_index="2" cpuset="0x00000044">
          <object type="PU" os_index="2" cpuset="0x00000004"/>
          <object type="PU" os_index="6" cpuset="0x00000040"/>
        </object>
        <object type="Core" os_index="3" cpuset="0x00000088">
          <object type="PU" os_index="3" cpuset="0x00000008"/>
          <object type="PU" os_index="7" cpuset="0x00000080"/>
        </object>
      </object>
    </object>
  </object>
</topology>
"""

# `bqueues` (IBM Spectrum LSF): a header row, then one queue per line.
BQUEUES = """QUEUE_NAME      PRIO STATUS          MAX JL/U JL/P JL/H NJOBS  PEND   RUN  SUSP
priority         43  Open:Active       -    -    -    -     0     0     0     0
normal           30  Open:Active       -    -    -    -    12     2    10     0
"""
