"""The container fields ALCF's sites need (site.container.module_paths, modules, directives, extra_args,
lib_dirs) and site.no_container_reason: hostile values in a profile reach the job script quoted, the script
stays shellcheck-clean and, run under bash with recording stand-ins, hands `module` and the launcher every
value verbatim; fields a schema cannot check are refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from sched_helpers import make_plan, render_plan, shellcheck
from test_injection import NASTY, run_script, sandbox  # noqa: F401  (sandbox is a fixture)

from hpcring.errors import ConfigError, ProfileError
from hpcring.schedulers import profile

BUILTIN_DIR = Path(profile.__file__).parent / "profiles"

PAYLOADS = [p for p in NASTY if p and "\n" not in p]


def _write(tmp: Path, base: str, edit: dict[str, Any], name: str = "site") -> str:
    """A copy of built-in profile `base` with `edit` merged into site.container; returns its path."""
    data = yaml.safe_load((BUILTIN_DIR / f"{base}.yaml").read_text())
    data["name"] = name
    data["site"]["container"].update(edit)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
@pytest.mark.parametrize("base", ["polaris", "aurora"])
def test_hostile_container_fields_reach_module_and_the_runtime_verbatim(
    base: str,
    payload: str,
    sandbox: dict[str, Any],  # noqa: F811
) -> None:
    tmp: Path = sandbox["tmp"]
    payload = payload.replace("{canary}", str(sandbox["canary"]))
    path = _write(
        tmp,
        base,
        {
            "module_paths": ["/soft/modulefiles", "/opt/mods"],
            "modules": ["apptainer", payload],
            "directives": ["-l singularity_fakeroot=true", f"-l note={payload}"],
            "extra_args": ["--fakeroot", payload, f"--opt={payload}"],
        },
    )
    image = tmp / "train.sif"
    image.write_text("")
    p = make_plan(path, nodes=1, account="a", image=str(image), command=("python3", payload))
    text = render_plan(p)
    script = tmp / "lint.sh"
    script.write_text(text)
    shellcheck(script)
    assert p.container is not None
    module_env = {name: f"/opt/{name}" for name in p.container.required_vars}
    res, calls = run_script(sandbox, text, module_env)
    assert res.returncode == 0, res.stderr
    assert not sandbox["canary"].exists(), "injected command ran"
    modules = [c["argv"] for c in calls if c["tool"] == "module"]
    assert modules == [
        ["use", "/soft/modulefiles"],
        ["use", "/opt/mods"],
        ["load", "apptainer"],
        ["load", payload],
        *([["load", "cray-mpich-abi"]] if base == "polaris" else []),
    ]
    (launch,) = [c for c in calls if c["tool"] == "mpiexec"]
    argv = launch["argv"]
    assert argv[-6:] == ["--fakeroot", payload, f"--opt={payload}", str(image), "python3", payload]


def test_container_directives_only_with_an_image(tmp_path: Path) -> None:
    path = _write(tmp_path, "polaris", {"directives": ["-l singularity_fakeroot=true", "--long=x y"]})
    with_image = render_plan(make_plan(path, nodes=1, account="a", image="/i.sif", command=("true",)))
    assert "#PBS -l singularity_fakeroot=true" in with_image.splitlines()
    assert '#PBS --long="x y"' in with_image.splitlines()
    host = render_plan(make_plan(path, nodes=1, account="a", command=("true",)))
    assert "singularity_fakeroot" not in host and "--long" not in host


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"module_paths": ["${SOFT}/modulefiles"]},
            r"site\.container\.module_paths\[0\]: '\$\{SOFT\}/modulefiles' holds a \$\{NAME\} reference",
        ),
        ({"module_paths": ["soft/modulefiles"]}, r"site\.container\.module_paths\[0\]: .* is relative"),
        ({"module_paths": ["/a:/b"]}, r"site\.container\.module_paths\[0\]: '/a:/b' is not a host path"),
        ({"lib_dirs": ["/hostevent"]}, r"site\.container\.lib_dirs: not allowed with host_mpi"),
        (
            {"directives": ["singularity_fakeroot=true"]},
            r"site\.container\.directives\[0\]: 'singularity_fakeroot=true' is not one directive",
        ),
        ({"directives": ["-l a\n#PBS -q vip"]}, r"site\.container\.directives\[0\]: .* is not one directive"),
    ],
)
def test_bad_container_fields_name_the_field(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        profile.load(_write(tmp_path, "polaris", edit))


def test_lib_dirs_and_env_library_path_conflict(tmp_path: Path) -> None:
    path = _write(tmp_path, "aurora", {"env": {"LD_LIBRARY_PATH": "/x"}})
    with pytest.raises(ProfileError, match=r"site\.container\.env\.LD_LIBRARY_PATH: set by lib_dirs"):
        profile.load(path)


def test_schema_refuses_unknown_container_fields(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="exec_flags"):
        profile.load(_write(tmp_path, "aurora", {"exec_flags": ["--fakeroot"]}))


def test_no_container_reason_with_a_runtime_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((BUILTIN_DIR / "aurora.yaml").read_text())
    data["site"]["no_container_reason"] = "none documented"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ProfileError, match=r"site\.no_container_reason: given, but site\.container configures"
    ):
        profile.load(str(path))


def test_refusal_without_a_reason_still_names_the_fix(tmp_path: Path) -> None:
    """A profile with no runtime and no reason (a copy of Perlmutter's without its reason) keeps the plain
    refusal; the built-in one gives NERSC's reason (its Shifter recipe) before the same fix."""
    data = yaml.safe_load((BUILTIN_DIR / "perlmutter-gpu.yaml").read_text())
    del data["site"]["no_container_reason"]
    data["name"] = "bare"
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"profile 'bare' has no container runtime; to run images"):
        make_plan(str(path), nodes=1, account="g", image="/i.sif", command=("true",))
    with pytest.raises(ConfigError, match=r"no container runtime: NERSC runs .*; to run images"):
        make_plan("perlmutter-gpu", nodes=1, account="g", image="/i.sif", command=("true",))
