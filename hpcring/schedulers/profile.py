"""Cluster profiles: find, parse, validate (JSON Schema, then cross-field checks) and build the frozen model.

A profile is a YAML file: one of the built-ins shipped in `profiles/`, a file named on the command line, a
file in a directory of `HPCRING_PROFILE_PATH`, or `local` (this machine, detected). Every error raised here is
a ProfileError naming the file, the YAML path, the bad value and what is allowed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hpcring.errors import ProfileError, choices
from hpcring.schedulers import (
    container_engine,
    containers,
    cpuset,
    kubernetes_options,
    network,
    safe_yaml,
    site_options,
    textfile,
    walltime,
)
from hpcring.schedulers.model import (
    LAUNCHERS_OF,
    Gpu,
    LsfOptions,
    Nic,
    Node,
    NumaDomain,
    Partition,
    Profile,
    Retired,
    Site,
    SlurmOptions,
)
from hpcring.schedulers.validation import validate

LOCAL = "local"


def builtin_names() -> list[str]:
    """Names of the profiles shipped with hpcring, plus `local`."""
    files = resources.files("hpcring.schedulers").joinpath("profiles").iterdir()
    names = sorted(f.name[: -len(".yaml")] for f in files if f.name.endswith(".yaml"))
    return [*names, LOCAL]


def _search_path() -> list[Path]:
    """User profile directories from HPCRING_PROFILE_PATH (colon separated), searched before the built-ins."""
    raw = os.environ.get("HPCRING_PROFILE_PATH", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def source_of(name_or_path: str) -> tuple[str, str]:
    """(where, YAML text) for a profile name or file path; `where` is used in error messages."""
    if name_or_path == LOCAL:
        from hpcring.schedulers.local import detect_yaml

        return "local (detected)", detect_yaml()
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        return str(path), read_text(path)
    for d in _search_path():
        candidate = d / f"{name_or_path}.yaml"
        if candidate.is_file():
            return str(candidate), read_text(candidate)
    res = resources.files("hpcring.schedulers").joinpath("profiles", f"{name_or_path}.yaml")
    if res.is_file():
        return f"{name_or_path} (built-in)", res.read_text("utf-8")
    if path.is_dir():
        raise ProfileError(f"profile file {name_or_path!r} is a directory, not a file")
    raise ProfileError(f"unknown profile {name_or_path!r}; built-in profiles: {choices(builtin_names())}")


MAX_PARTITIONS = 1024  # the profile schemas' maxItems for `partitions`


def read_text(path: Path) -> str:
    """A profile file's text, or one ProfileError line saying why it cannot be read (never a traceback)."""
    return textfile.read_text(path, "profile file", ProfileError)


def load(name_or_path: str) -> Profile:
    """Find, parse and validate a profile."""
    where, text = source_of(name_or_path)
    return parse(text, where)


def parse(text: str, where: str = "<profile>") -> Profile:
    """Parse YAML text into a validated Profile."""
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{where}: not valid YAML: {exc}") from exc
    site = data.get("site") if isinstance(data, dict) else None
    parts = site.get("partitions") if isinstance(site, dict) else None
    if isinstance(parts, list) and len(parts) > MAX_PARTITIONS:  # said before validating each of them
        raise ProfileError(
            f"{where}: site.partitions: {len(parts)} are too many; allowed: at most {MAX_PARTITIONS}"
        )
    validate(data, "profile", where, ProfileError)
    return build(data, where, text)


def _cpus(value: object, path: str, where: str) -> tuple[int, ...]:
    try:
        return cpuset.parse(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ProfileError(f"{where}: {path}: {exc}") from exc


def _wall(value: str | int, path: str, where: str) -> int:
    try:
        return walltime.parse(value)
    except ValueError as exc:
        raise ProfileError(f"{where}: {path}: {exc}") from exc


def _node(d: Mapping[str, Any], where: str) -> Node:
    sockets, cps = d["sockets"], d["cores_per_socket"]
    ncores = sockets * cps
    tpc = d.get("threads_per_core", 1)

    def err(path: str, msg: str) -> ProfileError:
        return ProfileError(f"{where}: node.{path}: {msg}")

    def check_cores(cores: tuple[int, ...], path: str) -> None:
        bad = [c for c in cores if c >= ncores]
        if bad:
            raise err(
                path, f"core {bad[0]} does not exist; allowed: 0-{ncores - 1} ({sockets} x {cps} cores)"
            )

    reserved = _cpus(d.get("reserved_cores", []), "node.reserved_cores", where)
    check_cores(reserved, "reserved_cores")
    if len(reserved) >= ncores:
        raise err("reserved_cores", f"all {ncores} cores are reserved; at least one must stay usable")
    numa = _numa(d, sockets, cps, where)
    for i, dom in enumerate(numa):
        check_cores(dom.cores, f"numa[{i}].cores")
    seen: dict[int, int] = {}
    for i, dom in enumerate(numa):
        for c in dom.cores:
            if c in seen:
                raise err(f"numa[{i}].cores", f"core {c} is already in NUMA domain {seen[c]}")
            seen[c] = dom.id
    missing = [c for c in range(ncores) if c not in seen]
    if missing:
        raise err(
            "numa", f"cores {cpuset.format_list(missing)} are in no NUMA domain; every core must be in one"
        )
    ids = [dom.id for dom in numa]
    if len(set(ids)) != len(ids):
        raise err("numa", f"NUMA domain ids must be unique, got {ids}")
    gpus = _gpus(d.get("gpus", []), numa, frozenset(reserved), err, check_cores)
    nics = tuple(Nic(n["name"], n.get("numa"), tuple(n.get("gpus", ()))) for n in d.get("nics", []))
    gpu_ids = [g.index for g in gpus]
    for i, nic in enumerate(nics):
        if nic.numa is not None and nic.numa not in ids:
            raise err(f"nics[{i}].numa", f"NUMA domain {nic.numa} does not exist; allowed: {choices(ids)}")
        unknown = [g for g in nic.gpus if g not in gpu_ids]
        if unknown:
            raise err(
                f"nics[{i}].gpus",
                f"GPU {unknown[0]} does not exist; allowed: {choices(gpu_ids) or 'none (no GPUs)'}",
            )
    if len({n.name for n in nics}) != len(nics):
        raise err("nics", "NIC names must be unique")
    return Node(
        sockets=sockets,
        cores_per_socket=cps,
        threads_per_core=tpc,
        thread_numbering=d.get("thread_numbering", "scatter"),
        reserved_cores=frozenset(reserved),
        numa=numa,
        gpus=gpus,
        gpu_vendor=d.get("gpu_vendor", "nvidia"),
        gpu_visibility=d.get("gpu_visibility", "isolated"),
        nics=nics,
        interconnect=d.get("interconnect", "ethernet"),
    )


def _numa(d: Mapping[str, Any], sockets: int, cps: int, where: str) -> tuple[NumaDomain, ...]:
    """NUMA domains as written, or one per socket when the profile leaves them out."""
    if "numa" not in d:
        return tuple(NumaDomain(s, tuple(range(s * cps, (s + 1) * cps))) for s in range(sockets))
    return tuple(
        NumaDomain(dom["id"], _cpus(dom["cores"], f"node.numa[{i}].cores", where))
        for i, dom in enumerate(d["numa"])
    )


def _gpus(
    items: list[Mapping[str, Any]],
    numa: tuple[NumaDomain, ...],
    reserved: frozenset[int],
    err: Any,
    check_cores: Any,
) -> tuple[Gpu, ...]:
    by_id = {dom.id: dom for dom in numa}
    out: list[Gpu] = []
    for i, g in enumerate(items):
        if g["numa"] not in by_id:
            raise err(
                f"gpus[{i}].numa",
                f"NUMA domain {g['numa']} does not exist; allowed: {choices(sorted(by_id))}",
            )
        dom = by_id[g["numa"]]
        if "closest_cores" in g:
            closest = cpuset.parse(g["closest_cores"])
            check_cores(closest, f"gpus[{i}].closest_cores")
            outside = [c for c in closest if c not in dom.cores]
            if outside:
                raise err(
                    f"gpus[{i}].closest_cores",
                    f"core {outside[0]} is not in the GPU's NUMA domain {dom.id} "
                    f"(cores {cpuset.format_list(dom.cores)})",
                )
        else:
            closest = dom.cores
        usable = tuple(c for c in closest if c not in reserved)
        if not usable:
            raise err(
                f"gpus[{i}].closest_cores", "every closest core is reserved; at least one must be usable"
            )
        if ("device" in g) != ("tile" in g):
            raise err(f"gpus[{i}]", "'device' and 'tile' go together: give both for a GPU tile, or neither")
        out.append(
            Gpu(
                g["index"],
                dom.id,
                usable,
                g.get("scheduler_index", g["index"]),
                device=g.get("device"),
                tile=g.get("tile"),
                apu=g.get("apu", False),
            )
        )
    for attr in ("index", "scheduler_index", "tile_id"):
        values = [getattr(g, attr) for g in out if getattr(g, attr) is not None]
        if len(set(values)) != len(values):
            raise err("gpus", f"GPU {attr} values must be unique, got {values}")
    tiled = [g.tile is not None for g in out]
    if any(tiled) and not all(tiled):
        raise err("gpus", "either every GPU entry is a tile (device and tile given) or none is")
    return tuple(out)


def _site(d: Mapping[str, Any], node: Node, where: str) -> Site:
    def err(path: str, msg: str) -> ProfileError:
        return ProfileError(f"{where}: site.{path}: {msg}")

    sched, launcher = d["scheduler"], d["launcher"]
    allowed = LAUNCHERS_OF[sched]
    if launcher not in allowed:
        raise err("launcher", f"{launcher!r} cannot launch under {sched}; allowed: {choices(allowed)}")
    smt = d.get("smt", 1)
    if smt > node.threads_per_core:
        raise err("smt", f"{smt} exceeds node.threads_per_core ({node.threads_per_core})")
    partitions = tuple(_partition(p, i, sched, where) for i, p in enumerate(d.get("partitions", [])))
    names = [p.name for p in partitions]
    if len(set(names)) != len(names):
        raise err("partitions", f"partition names must be unique, got {names}")
    if sum(p.default for p in partitions) > 1:
        raise err("partitions", "at most one partition may be the default")
    container = containers.from_profile(d.get("container"), d.get("mpi", "openmpi"), where)
    if container is not None and container.runtime == container_engine.RUNTIME and launcher != "srun":
        raise err(
            "container.runtime", f"{container.runtime!r} starts ranks through srun; launcher is {launcher!r}"
        )
    if container is not None and d.get("no_container_reason"):
        raise err("no_container_reason", "given, but site.container configures a runtime; drop one of them")
    s, lsf = d.get("slurm", {}), d.get("lsf", {})
    for section in ("slurm", "lsf", "pbs", "flux", "kubernetes"):
        if section in d and d[section] and sched != section:
            raise err(section, f"{section} options given but the scheduler is {sched!r}")
    if s.get("core_spec", 0) > node.cores:
        raise err("slurm.core_spec", f"{s['core_spec']} exceeds the node's {node.cores} cores")
    env = tuple((k, _env_str(v)) for k, v in (d.get("env") or {}).items())
    return Site(
        scheduler=sched,
        launcher=launcher,
        mpi=d.get("mpi", "openmpi"),
        partitions=partitions,
        account=d.get("account"),
        account_required=d.get("account_required", False),
        modules=tuple(d.get("modules", [])),
        env=env,
        smt=smt,
        require_even_ranks=d.get("require_even_ranks", True),
        rank_order=d.get("rank_order", "gpu"),
        network=network.from_profile(d.get("network"), sched, where),
        binding=d.get("binding", True),
        container=container,
        no_container_reason=d.get("no_container_reason"),
        slurm=SlurmOptions(
            core_spec=s.get("core_spec"),
            constraint=s.get("constraint"),
            gpu_bind=s.get("gpu_bind", "map"),
            mpi=s.get("mpi"),
            exclusive=s.get("exclusive", False),
            extra_directives=tuple(s.get("extra_directives", [])),
        ),
        lsf=LsfOptions(
            alloc_flags=tuple(lsf.get("alloc_flags", [])),
            launch_node=lsf.get("launch_node", False),
            extra_directives=tuple(lsf.get("extra_directives", [])),
        ),
        pbs=site_options.pbs(d.get("pbs") or {}, d.get("mpi", "openmpi"), where),
        flux=site_options.flux(d.get("flux") or {}, where),
        kubernetes=kubernetes_options.parse(d, where),
    )


def _env_str(value: object) -> str:
    """YAML env values may be numbers or booleans; the environment only holds strings."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _partition(p: Mapping[str, Any], i: int, sched: str, where: str) -> Partition:
    path = f"site.partitions[{i}]"
    selector = p.get("selector", "partition")
    allowed = ("partition", "qos") if sched == "slurm" else ("queue", "partition")
    if selector not in allowed:
        raise ProfileError(
            f"{where}: {path}.selector: {selector!r} is not a {sched} notion; allowed: {choices(allowed)}"
        )
    bins: list[tuple[int, int]] = []
    for j, b in enumerate(p.get("walltime_bins", [])):
        bins.append(
            (b["max_nodes"], _wall(b["max_walltime"], f"{path}.walltime_bins[{j}].max_walltime", where))
        )
    if [b[0] for b in bins] != sorted(b[0] for b in bins):
        raise ProfileError(f"{where}: {path}.walltime_bins: bins must be sorted by max_nodes, smallest first")
    min_nodes = p.get("min_nodes", 1)
    if p.get("max_nodes") is not None and min_nodes > p["max_nodes"]:
        raise ProfileError(
            f"{where}: {path}.min_nodes: {min_nodes} is above max_nodes {p['max_nodes']}; no job could fit"
        )
    return Partition(
        name=p["name"],
        max_walltime_s=_wall(p["max_walltime"], f"{path}.max_walltime", where),
        max_nodes=p.get("max_nodes"),
        min_nodes=min_nodes,
        default=p.get("default", False),
        selector=selector,
        walltime_bins=tuple(bins),
    )


def _retired(d: Mapping[str, Any] | None) -> Retired | None:
    return None if d is None else Retired(str(d["date"]), d["source"])


def build(data: Mapping[str, Any], where: str, text: str) -> Profile:
    """Cross-field checks and construction of the frozen model from schema-valid data."""
    node = _node(data["node"], where)
    site = _site(data["site"], node, where)
    return Profile(
        name=data["name"],
        description=data.get("description", ""),
        node=node,
        site=site,
        source=text,
        digest=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        retired=_retired(data.get("retired")),
    )
