"""Schema version 2: selected by `schema_version: 2`, adds PBS and Flux (schedulers, launchers, their
sections); version 1 profiles keep their own schema, so a v1 file naming PBS is still refused with v1's
choices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sched_helpers import cli

from hpcring.errors import ProfileError
from hpcring.schedulers import profile


def _v2(scheduler: str, launcher: str, **site: Any) -> dict[str, Any]:
    return {
        "schema_version": 2,
        "name": f"test-{scheduler}",
        "node": {"sockets": 1, "cores_per_socket": 8, "gpus": []},
        "site": {"scheduler": scheduler, "launcher": launcher, **site},
    }


@pytest.mark.parametrize(
    ("scheduler", "launcher"),
    [
        ("pbs", "mpiexec"),
        ("pbs", "mpirun"),
        ("flux", "flux"),
        ("slurm", "srun"),
        ("slurm", "mpirun"),
        ("lsf", "jsrun"),
        ("lsf", "mpirun"),
    ],
)
def test_v2_scheduler_launcher_pairs_load(scheduler: str, launcher: str) -> None:
    p = profile.parse(yaml.safe_dump(_v2(scheduler, launcher)), "v2.yaml")
    assert (p.site.scheduler, p.site.launcher) == (scheduler, launcher)


@pytest.mark.parametrize(
    ("scheduler", "launcher", "allowed"),
    [
        ("pbs", "srun", "'mpiexec' or 'mpirun'"),
        ("flux", "mpirun", "'flux'"),
        ("slurm", "flux", "'srun' or 'mpirun'"),
        ("lsf", "mpiexec", "'jsrun' or 'mpirun'"),
    ],
)
def test_v2_wrong_launcher_names_the_allowed_ones(scheduler: str, launcher: str, allowed: str) -> None:
    with pytest.raises(ProfileError) as info:
        profile.parse(yaml.safe_dump(_v2(scheduler, launcher)), "v2.yaml")
    assert f"v2.yaml: site.launcher: {launcher!r} cannot launch under {scheduler}; allowed: {allowed}" == str(
        info.value
    )


def test_v2_sections_belong_to_their_scheduler() -> None:
    for section, sched, launcher in (("pbs", "flux", "flux"), ("flux", "pbs", "mpiexec")):
        data = _v2(sched, launcher)
        data["site"][section] = {}
        profile.parse(yaml.safe_dump(data), "ok.yaml")  # an empty section says nothing: accepted
    data = _v2("slurm", "srun", slurm={"exclusive": True})
    data["schema_version"] = 2
    profile.parse(yaml.safe_dump(data), "ok.yaml")
    bad = _v2("pbs", "mpiexec", slurm={"exclusive": True})
    with pytest.raises(ProfileError, match=r"site.slurm: slurm options given but the scheduler is 'pbs'"):
        profile.parse(yaml.safe_dump(bad), "bad.yaml")


def test_v1_profile_keeps_v1_schema() -> None:
    data = _v2("pbs", "mpirun")
    data["schema_version"] = 1
    with pytest.raises(
        ProfileError, match=r"site.scheduler: 'pbs' is not allowed; allowed: 'slurm' or 'lsf'"
    ):
        profile.parse(yaml.safe_dump(data), "v1.yaml")
    data = _v2("slurm", "srun")
    data["schema_version"] = 1
    data["site"]["pbs"] = {}
    with pytest.raises(ProfileError, match=r"site: unknown key 'pbs'"):
        profile.parse(yaml.safe_dump(data), "v1.yaml")


def test_v2_unknown_scheduler_lists_the_v2_choices() -> None:
    with pytest.raises(ProfileError, match=r"'slurm', 'lsf', 'pbs', 'flux' or 'kubernetes'"):
        profile.parse(yaml.safe_dump(_v2("sge", "srun")), "v2.yaml")


def test_cli_validates_a_v2_pbs_profile(tmp_path: Path) -> None:
    f = tmp_path / "pbs.yaml"
    f.write_text(yaml.safe_dump(_v2("pbs", "mpiexec")))
    res = cli("profiles", "validate", str(f))
    assert res.returncode == 0, res.stderr
    assert "pbs/mpiexec" in res.stdout
    mapped = cli("map", "--profile", str(f), "--nodes", "2", "--format", "json")
    assert mapped.returncode == 0, mapped.stderr
    ranks = json.loads(mapped.stdout)
    assert [r["node"] for r in ranks] == [0, 1]
