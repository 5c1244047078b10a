"""CSCS's Container Engine (Alps): the job's image described by an environment definition file (EDF,
TOML) and started by Slurm itself, `srun --environment=<edf> command`, instead of a runtime wrapped around
each rank.

As CSCS documents it (https://docs.cscs.ch/software/container-engine/, run.md and edf.md): `--environment`
takes an absolute path to an EDF, a relative one starting with `./`, or a name on the EDF search path; an EDF
holds `image` (a registry reference `[REGISTRY#]IMAGE[:TAG]` or a Squashfs file), `mounts`
(`SOURCE:DESTINATION[:FLAGS]`), `workdir`, an `[env]` table and `[annotations]` (hooks); the container
inherits the host environment (the image's variables take precedence), and the Container Engine expands
`${VAR}` in EDF values from the environment srun runs in.

hpcring writes the EDF from `--image`/`--bind` and the profile (every string TOML-escaped; it travels in the
job script as a quoted here-document, or next to it with `-o`), or takes the user's own EDF when `--image`
names a `.toml` file. Either way the srun line gets `--environment=...` and the profile's `extra_args`
(Alps: `--mpi=pmi2`, CSCS's launch flag for MPICH inside containers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from hpcring.errors import ConfigError, ProfileError
from hpcring.schedulers.model import Container
from hpcring.schedulers.shell import Raw

RUNTIME = "container-engine"
EDF_VAR = "HPCRING_EDF"  # the script variable holding the generated EDF's path
EDF_SUFFIX = "edf.toml"
# The job's working directory, mounted at the same path and made the container's: what CSCS's quick start
# does with ${SCRATCH}; the Container Engine expands ${PWD} from srun's environment.
WORKDIR = "${PWD}"
_ANNOTATION_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes (\\", \\\\, \\n, \\uXXXX) are TOML's too; TOML also wants DEL
    (U+007F) escaped, which JSON leaves as is."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def is_user_edf(image: str) -> bool:
    """`--image` names the user's own EDF (a `.toml` file) rather than an image."""
    return image.endswith(".toml")


# Apptainer/Singularity image files: not something the Container Engine can start (edf.md: `image` is "a
# remote Docker/OCI registry or a local Squashfs file").
_SIF_SUFFIXES = (".sif", ".simg")


def check_image(image: str) -> None:
    """Refuse an Apptainer image, naming what the Container Engine takes instead (a hard error: the job
    would otherwise fail on the compute node, after its wait in the queue)."""
    if image.lower().endswith(_SIF_SUFFIXES):
        raise ConfigError(
            f"--image {image!r}: CSCS's Container Engine does not run Apptainer/Singularity images; give a "
            "registry reference ([REGISTRY#]IMAGE[:TAG], e.g. nvcr.io#nvidia/pytorch:25.11-py3), a SquashFS "
            "file made with `enroot import docker://REGISTRY#IMAGE:TAG` (.sqsh), or your own EDF (.toml) "
            "(https://docs.cscs.ch/software/container-engine/, run.md and edf.md)"
        )


def environment_arg(image: str) -> Raw | str:
    """The `--environment=` word: the generated EDF's variable, or the user's EDF path (`./` before a relative
    one, as the Container Engine requires)."""
    if not is_user_edf(image):
        return Raw(f'--environment="${EDF_VAR}"')
    path = image if image.startswith(("/", "./", "../")) else "./" + image
    return "--environment=" + path


def _mount(bind: str) -> str:
    """A `--bind` value as an EDF mount: `SRC` -> `SRC:SRC`; `SRC:DST[:FLAGS]` as given."""
    return bind if ":" in bind else f"{bind}:{bind}"


def check_annotations(values: Sequence[tuple[str, str]], field: str) -> tuple[tuple[str, str], ...]:
    """Annotation keys as CSCS writes them (`com.hooks.aws_ofi_nccl.enabled`): dotted plain words."""
    for key, _ in values:
        if not _ANNOTATION_KEY.match(key):
            raise ProfileError(
                f"{field}.{key}: not an annotation key; expected dot-separated words of letters, digits, "
                "_ and -"
            )
    return tuple(values)


def edf(c: Container, image: str, binds: Sequence[str]) -> str:
    """The EDF text for a job running `image` with the profile's and the job's binds. Every value is a TOML
    basic string, so quotes, backslashes and line breaks stay inside it (escaped) whatever they are."""
    mounts = [f"{WORKDIR}:{WORKDIR}", *(_mount(b) for b in (*c.binds, *c.devices, *binds))]
    lines = [
        "# hpcring: environment definition for CSCS's Container Engine (srun --environment); generated.",
        f"image = {toml_string(image)}",
        "mounts = [" + ", ".join(toml_string(m) for m in dict.fromkeys(mounts)) + "]",
        f"workdir = {toml_string(WORKDIR)}",
    ]
    if c.env:
        lines += ["", "[env]", *(f"{k} = {toml_string(v)}" for k, v in c.env)]
    if c.annotations:
        lines += ["", "[annotations]", *(f"{k} = {toml_string(v)}" for k, v in c.annotations)]
    return "\n".join(lines) + "\n"
