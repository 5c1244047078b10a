"""docs/guide/cli.md, "Machine-readable output", names every key the commands write, and no key they do not.

Each documented key list is parsed from the page and compared with a real run's output, so a key added,
renamed or dropped in the code without the page fails here.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

from support import ROOT

from hpcring.engine.tuning_search import _CsvLog

DOC = ROOT / "docs" / "guide" / "cli.md"
_KEY = re.compile(r"`([A-Za-z0-9_]+(?:\[\]\.[a-z_]+)?)`")


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m hpcring ARGV`, the real entry point."""
    return subprocess.run(
        [sys.executable, "-m", "hpcring", *argv], capture_output=True, text=True, timeout=120
    )


def _section(title: str) -> str:
    """The paragraph (and table) of `title` inside the page's "Machine-readable output" section."""
    text = DOC.read_text()
    text = text[text.index("## Machine-readable output") : text.index("The tables below are generated")]
    start = text.index(f"**{title}")
    end = text.find("\n**", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table(title: str) -> dict[str, str]:
    """The first-column key(s) of each row of a section's table -> the row's second column."""
    rows: dict[str, str] = {}
    for line in _section(title).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        for key in _KEY.findall(cells[0]):
            rows[key] = cells[1]
    return rows


def test_doctor_json_keys_are_documented() -> None:
    res = cli("doctor", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    doc = _table("`hpcring doctor --json`")
    assert set(report) == set(doc)
    for key, value in report.items():
        if isinstance(value, dict):
            documented = set(_KEY.findall(doc[key]))
            assert set(value) <= documented, f"{key}: {sorted(set(value) - documented)} not documented"


def test_bench_json_keys_are_documented(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "hpcring",
        "run",
        "-np",
        "1",
        "--quiet",
        "--",
        sys.executable,
        "-m",
        "hpcring",
    ]
    cmd += [
        "bench",
        "allreduce",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "-a",
        "native",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    doc = _table("`hpcring bench allreduce --json FILE`")
    header = {k for k in doc if "[]" not in k}
    fields = {k.split(".", 1)[1] for k in doc if k.startswith("results[].")}
    assert set(data) - {"results"} == header
    assert {key for row in data["results"] for key in row} == fields
    assert [r["vs_raw"] for r in data["results"] if r["algorithm"] == "mpi4py-raw"] == [1.0]


def test_map_json_keys_are_documented() -> None:
    res = cli("map", "--profile", "aurora", "--nodes", "1", "--format", "json")
    assert res.returncode == 0, res.stderr
    keys = {key for record in json.loads(res.stdout) for key in record}
    documented = set(_KEY.findall(_section("`hpcring map --format json`")))
    assert keys <= documented, sorted(keys - documented)


def test_autotune_log_columns_are_documented(tmp_path: Path) -> None:
    log = _CsvLog(str(tmp_path / "tune.csv"))
    log.close()
    header = next(csv.reader((tmp_path / "tune.csv").read_text().splitlines()))
    section = _KEY.findall(_section("`HOROVOD_AUTOTUNE_LOG`"))
    documented = [k for k in section if k not in ("HOROVOD_AUTOTUNE_LOG", "chosen")]
    assert header == documented
