"""The package's metadata states ranges; exact builds belong to the project's own set-up (constraints.txt).

A user on a GPU cluster installs `hpcring[torch]` next to the site's CUDA build of torch: an exact pin in
the metadata would make pip replace that build or fail to resolve. These checks build the metadata the way pip
does (setuptools' PEP 517 hook) from this checkout, so a stale editable install cannot hide a pin.
"""

from __future__ import annotations

import subprocess
import sys
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support import ROOT

EXACT = ("==", "===")


def _built_requirements(tmp_path: Path) -> list[Requirement]:
    code = (
        "import sys\nfrom setuptools import build_meta\n"
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    dist_info = tmp_path / out.stdout.strip().splitlines()[-1]
    meta = Parser().parsestr((dist_info / "METADATA").read_text("utf-8"))
    return [Requirement(r) for r in meta.get_all("Requires-Dist") or []]


@pytest.fixture(scope="module")
def requirements(tmp_path_factory: pytest.TempPathFactory) -> list[Requirement]:
    return _built_requirements(tmp_path_factory.mktemp("metadata"))


def test_metadata_has_no_exact_pin_of_any_dependency(requirements: list[Requirement]) -> None:
    pinned = [str(r) for r in requirements for s in r.specifier if s.operator in EXACT]
    assert not pinned, f"exact pins in the package metadata: {pinned}"


def test_torch_extra_states_the_lowest_tested_release(requirements: list[Requirement]) -> None:
    torch = [r for r in requirements if r.name == "torch"]
    assert torch, "the torch extra is gone"
    for r in torch:
        assert r.marker is not None and r.marker.evaluate({"extra": "torch"}), r
        lows = [s for s in r.specifier if s.operator == ">="]
        assert lows and not [s for s in r.specifier if s.operator in ("<", "<=", "!=")], r
        # A site's newer CUDA build must satisfy the range; the project's own pin must too.
        assert r.specifier.contains("2.13.0") and r.specifier.contains("2.99.0+cu128", prereleases=True), r


def test_project_setup_pins_torch_through_constraints() -> None:
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    pins = [Requirement(ln) for ln in lines if ln]
    assert [str(r.specifier) for r in pins if r.name == "torch"] == ["==2.13.0"]
    makefile = (ROOT / "Makefile").read_text()
    installs = [ln for ln in makefile.splitlines() if "pip install" in ln and "-e" in ln]
    assert installs and all("-c constraints.txt" in ln for ln in installs), installs
