"""Environment implied by the node's interconnect for NCCL/RCCL and UCX.

These are the usual starting points from the sites' guides (OLCF for Slingshot + aws-ofi-rccl, NVIDIA for
InfiniBand/RoCE); a profile's `site.env` and a job's `env` are applied after them and win, and a profile's
`site.network` block (the site's own documented stack, network.py) replaces them for GPU jobs. NCCL variables
only for NVIDIA and AMD GPUs: Intel GPUs use oneCCL, which reads none of them.
"""

from __future__ import annotations

from hpcring.schedulers.model import Node


def env_for(node: Node, uses_gpus: bool) -> list[tuple[str, str]]:
    """(name, value) pairs for the interconnect; NCCL variables only when ranks use NVIDIA or AMD GPUs."""
    ic = node.interconnect
    uses_gpus = uses_gpus and node.gpu_vendor != "intel"  # the NCCL/RCCL variables below
    nic_names = [n.name for n in node.nics]
    out: list[tuple[str, str]] = []
    if ic in ("infiniband", "roce"):
        if uses_gpus:
            out.append(("NCCL_IB_DISABLE", "0"))
            if nic_names:
                out.append(("NCCL_IB_HCA", ",".join(nic_names)))
            if ic == "roce":
                out.append(("NCCL_IB_GID_INDEX", "3"))  # RoCE v2 GID on most Linux stacks
        if nic_names:
            out.append(("UCX_NET_DEVICES", ",".join(f"{n}:1" for n in nic_names)))
    elif ic == "slingshot":
        out.append(("FI_PROVIDER", "cxi"))
        if uses_gpus:
            out += [("NCCL_SOCKET_IFNAME", "hsn"), ("NCCL_NET_GDR_LEVEL", "PHB"), ("NCCL_CROSS_NIC", "1")]
    elif uses_gpus:  # ethernet
        out.append(("NCCL_IB_DISABLE", "1"))
        if nic_names:
            out.append(("NCCL_SOCKET_IFNAME", ",".join(nic_names)))
    return out
