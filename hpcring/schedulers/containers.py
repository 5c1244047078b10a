"""Container wrapping: the host launcher starts the runtime on every rank, which starts the rank command.

`srun ... apptainer exec --rocm --bind /opt/cray --env LD_LIBRARY_PATH=... image.sif python train.py`.
Two ways to get MPI inside (docs/guide/containers.md, "Hybrid MPI"):

- hybrid model (no `host_mpi` in the profile): the image's own MPI talks to the host launcher through PMI;
- bind model (`host_mpi`): the host's MPI directories are bound in and its ABI-compatible libmpi replaces the
  image's. mpi4py (4.1 PyPI wheel) picks the library named by MPI4PY_LIBMPI, resolved on LD_LIBRARY_PATH;
  LD_LIBRARY_PATH alone is not enough because mpi4py first tries the venv's own lib directory by full path.

Profile paths may hold `${NAME}` references (Cray's module-set `${CRAY_MPICH_ROOTDIR}`): they become
`"${NAME}"` in the script, so the shell on the first node expands them; the script's container check stops
the job before any launch when one is unset or empty. Everything else is quoted literally.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcring.errors import ConfigError, ProfileError, choices
from hpcring.schedulers import container_engine
from hpcring.schedulers.model import ABI_OF_SITE_MPI, RUNTIMES, Container, HostMpi, Profile
from hpcring.schedulers.shell import Raw, quote

# Where `host_mpi.libs` are bound inside the container; the hpcring images create it (containers/Dockerfile).
HOST_LIBS_DIR = "/opt/hpcring/host-libs"
# Where Apptainer/Singularity put the driver libraries of --nv/--rocm; kept on LD_LIBRARY_PATH explicitly in
# case a runtime does not append it after our --env (Apptainer documents it as the default value).
RUNTIME_LIBS_DIR = "/.singularity.d/libs"
# Variables the bind model sets itself; a profile's container env may not set them too.
HOST_MPI_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "MPI4PY_LIBMPI")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(r"\$\{(" + _NAME + r")\}")
_LITERAL = re.compile(r"^[A-Za-z0-9_.+@%/-]*$")
# --env values: one --env may carry several NAME=VALUE pairs separated by commas (so a value holding '=' can
# be split), quotes are part of that syntax, and Apptainer evaluates `$` inside the container; none of that
# may happen to a literal value.
_ENV_VALUE_FORBIDDEN = ("=", "$", "`", '"', "\\")


@dataclass(frozen=True)
class ContainerPlan:
    """The runtime, image and the argv prefix that goes before every rank command."""

    runtime: str
    image: str
    prefix: tuple[str, ...]
    modules: tuple[str, ...] = ()  # loaded before the steps, only because the job runs in a container
    required_vars: tuple[str, ...] = ()  # `${NAME}` the prefix expands: checked set before any launch
    model: str = "hybrid"  # "hybrid": the image's MPI; "bind": the host's MPI library replaces it
    module_paths: tuple[str, ...] = ()  # `module use`d before any module is loaded
    directives: tuple[str, ...] = ()  # batch directives only container jobs carry (the scheduler's syntax)
    # CSCS Container Engine: words for the launcher itself (`--environment=...`, `--mpi=pmi2`) and the EDF
    # hpcring writes (None: the user's own EDF, or another runtime).
    launcher_args: tuple[str, ...] = ()
    edf: str | None = None


def host_path_parts(value: str) -> list[tuple[bool, str]]:
    """Split `${A}/lib` into [(True, "A"), (False, "/lib")]: (is a reference, text)."""
    parts: list[tuple[bool, str]] = []
    pos = 0
    for m in _REF.finditer(value):
        if m.start() > pos:
            parts.append((False, value[pos : m.start()]))
        parts.append((True, m.group(1)))
        pos = m.end()
    if pos < len(value):
        parts.append((False, value[pos:]))
    return parts


def check_host_path(value: str, field: str) -> str:
    """A host path expression: absolute or starting with `${NAME}`, safe characters only, no ':' or ','."""
    parts = host_path_parts(value)
    allowed = (
        "an absolute path or one starting with ${NAME}, made of letters, digits, _ . + @ % / - and ${NAME} "
        "references (':' and ',' separate paths for the runtime, so they cannot be part of one)"
    )
    bad = [text for is_ref, text in parts if not is_ref and not _LITERAL.match(text)]
    if bad or not parts:
        raise ProfileError(f"{field}: {value!r} is not a host path; expected {allowed}")
    first_is_ref, first = parts[0]
    if not first_is_ref and not first.startswith("/"):
        raise ProfileError(f"{field}: {value!r} is relative; expected {allowed}")
    return value


def expand(value: str) -> Raw:
    """The shell word for a host path expression: literals quoted, `${NAME}` left for the shell to expand."""
    return Raw(
        "".join(f'"${{{text}}}"' if is_ref else quote(text) for is_ref, text in host_path_parts(value))
    )


def referenced_vars(values: Sequence[str]) -> tuple[str, ...]:
    """The `${NAME}`s the host path expressions use, in first-use order."""
    names = [text for value in values for is_ref, text in host_path_parts(value) if is_ref]
    return tuple(dict.fromkeys(names))


def host_mpi_paths(m: HostMpi) -> tuple[str, ...]:
    """Every path expression of the bind model, in the order the runtime's words use them."""
    return (*m.binds, *m.libs, *m.lib_dirs, *m.preload)


def _unique(values: Sequence[str], field: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ProfileError(f"{field}: {v!r} is listed twice; list each path once")
        seen.add(v)


def _paths(d: Mapping[str, Any], key: str, field: str) -> tuple[str, ...]:
    values = tuple(check_host_path(v, f"{field}.{key}[{i}]") for i, v in enumerate(d.get(key, [])))
    _unique(values, f"{field}.{key}")
    return values


def _host_mpi(d: Mapping[str, Any], site_mpi: str, where: str) -> HostMpi:
    field = f"{where}: site.container.host_mpi"
    abi = d["abi"]
    family = ABI_OF_SITE_MPI.get(site_mpi)
    if family != abi:
        fits = [m for m, f in ABI_OF_SITE_MPI.items() if f == abi]
        raise ProfileError(
            f"{field}.abi: {abi!r} does not fit site.mpi {site_mpi!r}; the {abi} ABI is provided by "
            f"{choices(fits)}"
            + (
                " (Spectrum MPI ships libmpi_ibm.so, ABI-compatible with neither family)"
                if site_mpi == "spectrum-mpi"
                else ""
            )
        )
    libs = _paths(d, "libs", field)
    names = [posixpath.basename(v) for v in libs]
    for i, (lib, name) in enumerate(zip(libs, names, strict=True)):
        if _REF.search(name) or not name:
            raise ProfileError(
                f"{field}.libs[{i}]: {lib!r} must end in a literal file name (it becomes "
                f"{HOST_LIBS_DIR}/<name> inside the container)"
            )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProfileError(f"{field}.libs: file name {dup[0]!r} appears twice; each lands in {HOST_LIBS_DIR}")
    return HostMpi(
        abi=abi,
        modules=tuple(d.get("modules", [])),
        binds=_paths(d, "binds", field),
        libs=libs,
        lib_dirs=_paths(d, "lib_dirs", field),
        preload=_paths(d, "preload", field),
    )


def _env(d: Mapping[str, Any], field: str, has_host_mpi: bool) -> tuple[tuple[str, str], ...]:
    out = []
    for name, raw in (d or {}).items():
        value = ("1" if raw else "0") if isinstance(raw, bool) else str(raw)
        bad = [c for c in _ENV_VALUE_FORBIDDEN if c in value] + [c for c in "\n\r\0" if c in value]
        if bad:
            raise ProfileError(
                f"{field}.{name}: value {value!r} contains {bad[0]!r}; --env values may not contain "
                f"{choices(_ENV_VALUE_FORBIDDEN)} or line breaks"
            )
        if has_host_mpi and name in HOST_MPI_VARS:
            raise ProfileError(
                f"{field}.{name}: set by site.container.host_mpi; use host_mpi.lib_dirs / preload instead"
            )
        out.append((name, value))
    return tuple(out)


def _module_paths(c: Mapping[str, Any], field: str) -> tuple[str, ...]:
    """`module use` directories: literal absolute paths (the shell gets them quoted, so `${NAME}` would not
    expand)."""
    values = _paths(c, "module_paths", field)
    for i, v in enumerate(values):
        if _REF.search(v):
            raise ProfileError(
                f"{field}.module_paths[{i}]: {v!r} holds a ${{NAME}} reference; module_paths are literal "
                "absolute paths (modules loaded before them cannot set the variable)"
            )
    return values


def _lib_dirs(c: Mapping[str, Any], field: str, env: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    values = _paths(c, "lib_dirs", field)
    if values and c.get("host_mpi"):
        raise ProfileError(
            f"{field}.lib_dirs: not allowed with host_mpi, which sets LD_LIBRARY_PATH itself; use "
            "host_mpi.lib_dirs"
        )
    if values and any(name == "LD_LIBRARY_PATH" for name, _ in env):
        raise ProfileError(f"{field}.env.LD_LIBRARY_PATH: set by lib_dirs; give the directories there only")
    return values


def _directives(c: Mapping[str, Any], field: str) -> tuple[str, ...]:
    values = tuple(c.get("directives", []))
    for i, v in enumerate(values):
        if not v.startswith("-") or any(ch in v for ch in "\n\r\0"):
            raise ProfileError(
                f"{field}.directives[{i}]: {v!r} is not one directive; expected a flag starting with '-' "
                "(e.g. '-l singularity_fakeroot=true'), on one line"
            )
    return values


def from_profile(c: Mapping[str, Any] | None, site_mpi: str, where: str) -> Container | None:
    """The Container of a schema-valid `site.container`, after the checks a schema cannot make."""
    if not c:
        return None
    field = f"{where}: site.container"
    devices = tuple(c.get("devices", []))
    for i, dev in enumerate(devices):
        if not _LITERAL.match(dev) or "/../" in dev + "/":
            raise ProfileError(
                f"{field}.devices[{i}]: {dev!r} is not a plain device path; expected /dev/NAME with letters, "
                "digits and _ . + @ % / -"
            )
    host_mpi = _host_mpi(c["host_mpi"], site_mpi, where) if c.get("host_mpi") else None
    env = _env(c.get("env", {}), f"{field}.env", host_mpi is not None)
    annotations = tuple((c.get("annotations") or {}).items())
    if annotations and c["runtime"] != container_engine.RUNTIME:
        raise ProfileError(f"{field}.annotations: only for runtime {container_engine.RUNTIME!r} (EDF hooks)")
    if c["runtime"] == container_engine.RUNTIME and (host_mpi or c.get("lib_dirs") or c.get("modules")):
        raise ProfileError(
            f"{field}: host_mpi, lib_dirs and modules are Apptainer/Singularity settings; the Container "
            "Engine takes mounts, env and annotations in its EDF (binds, env, annotations here)"
        )
    annotations = container_engine.check_annotations(annotations, f"{field}.annotations")
    return Container(
        runtime=c["runtime"],
        binds=tuple(c.get("binds", [])),
        extra_args=tuple(c.get("extra_args", [])),
        devices=devices,
        env=env,
        host_mpi=host_mpi,
        module_paths=_module_paths(c, field),
        modules=tuple(c.get("modules", [])),
        directives=_directives(c, field),
        lib_dirs=_lib_dirs(c, field, env),
        annotations=annotations,
    )


def library_path(dirs: Sequence[Raw]) -> Raw:
    """The LD_LIBRARY_PATH word: `dirs`, the runtime's driver libraries, then the image's own entries.

    `$LD_LIBRARY_PATH` reaches the runtime literally (single quotes): Apptainer evaluates it inside the
    container, keeping the image's own entries after ours.
    """
    return Raw("LD_LIBRARY_PATH=" + ":".join([*dirs, RUNTIME_LIBS_DIR, "'$LD_LIBRARY_PATH'"]))


def host_mpi_args(m: HostMpi) -> list[str]:
    """`--bind`/`--env` words of the bind model: host MPI paths in, its libmpi first on the library path."""
    argv: list[str] = []
    for b in m.binds:
        argv += ["--bind", expand(b)]
    for lib in m.libs:
        dest = f"{HOST_LIBS_DIR}/{posixpath.basename(lib)}"
        argv += ["--bind", Raw(expand(lib) + ":" + quote(dest))]
    dirs = [expand(d) for d in m.lib_dirs]
    if m.libs:
        dirs.append(Raw(quote(HOST_LIBS_DIR)))
    argv += ["--env", library_path(dirs)]
    argv += ["--env", f"MPI4PY_LIBMPI={m.soname}"]
    if m.preload:
        joined = ":".join(expand(p) for p in m.preload)
        argv += ["--env", Raw("LD_PRELOAD=" + joined)]
    return argv


def plan(profile: Profile, image: str | None, binds: Sequence[str], uses_gpus: bool) -> ContainerPlan | None:
    """The container plan for a job, or None when it runs on the host."""
    if image is None:
        return None
    c = profile.site.container
    if c is None:
        reason = profile.site.no_container_reason
        raise ConfigError(
            f"--image given, but profile {profile.name!r} has no container runtime"
            + (f": {reason}" if reason else "")
            + f"; to run images anyway, set site.container.runtime to {choices(RUNTIMES)} in a copy of "
            "the profile"
        )
    if c.runtime == container_engine.RUNTIME:
        return _engine_plan(c, image, binds)
    argv: list[str] = [c.runtime, "exec"]
    gpu_flag = {"amd": "--rocm", "nvidia": "--nv"}.get(profile.node.gpu_vendor)  # intel: /dev/dri as is
    if uses_gpus and gpu_flag:
        argv.append(gpu_flag)
    for b in (*c.binds, *c.devices):
        argv += ["--bind", b]
    if c.host_mpi is not None:
        argv += host_mpi_args(c.host_mpi)
    if c.lib_dirs:
        argv += ["--env", library_path([expand(d) for d in c.lib_dirs])]
    for b in binds:
        argv += ["--bind", b]
    for name, value in c.env:
        argv += ["--env", f"{name}={value}"]
    argv += [*c.extra_args, image]
    host_mpi = c.host_mpi
    return ContainerPlan(
        c.runtime,
        image,
        tuple(argv),
        modules=(*c.modules, *(host_mpi.modules if host_mpi else ())),
        required_vars=referenced_vars([*(host_mpi_paths(host_mpi) if host_mpi else ()), *c.lib_dirs]),
        model="bind" if host_mpi else "hybrid",
        module_paths=c.module_paths,
        directives=c.directives,
    )


def _engine_plan(c: Container, image: str, binds: Sequence[str]) -> ContainerPlan:
    """CSCS's Container Engine: no prefix on the rank command; srun gets `--environment=` and the EDF."""
    container_engine.check_image(image)
    user_edf = container_engine.is_user_edf(image)
    if user_edf and binds:
        raise ConfigError(
            f"--bind with the user EDF {image!r}: the Container Engine takes mounts from the EDF; add them "
            "to its `mounts` list"
        )
    return ContainerPlan(
        c.runtime,
        image,
        (),
        directives=c.directives,
        launcher_args=(container_engine.environment_arg(image), *c.extra_args),
        edf=None if user_edf else container_engine.edf(c, image, binds),
    )
