"""The table of built-in sites in docs/guide/clusters.md matches the profiles (see site_table.py): a profile
without a row, a stale scheduler, launcher, binding or documentation page, or an unwritten "checked against"
cell fails here. `HPCRING_UPDATE_DOCS=1` regenerates the generated cells."""

from __future__ import annotations

import os

import site_table as t

from hpcring.schedulers import profile


def test_table_matches_every_builtin_profile() -> None:
    text = t.DOC.read_text("utf-8")
    if os.environ.get("HPCRING_UPDATE_DOCS") == "1":
        text = t.update(text)
        t.DOC.write_text(text, "utf-8")
    assert t.problems(text) == []
    assert sorted(t.read(text)) == sorted(n for n in profile.builtin_names() if n != profile.LOCAL)


def test_documentation_page_is_one_the_profile_cites() -> None:
    for name, cells in t.read(t.DOC.read_text("utf-8")).items():
        page = cells[5]
        source = profile.source_of(name)[1]
        if "https://" not in source:
            assert page == "none (a template)", name
            continue
        assert page.startswith("<https://") and page.strip("<>") in source, (name, page)


def test_missing_stale_and_unwritten_rows_are_reported() -> None:
    text = t.DOC.read_text("utf-8")
    lines = text.splitlines(keepends=True)
    without = "".join(line for line in lines if not line.startswith("| `summit` |"))
    assert t.problems(without) == ["no row for profile 'summit'"]
    stale = text.replace(
        "| `summit` | OLCF Summit | lsf | jsrun |", "| `summit` | OLCF Summit | lsf | mpirun |"
    )
    assert [p.split(" is ")[0] for p in t.problems(stale)] == ["row 'summit'"]
    fresh = t.update(without)  # regenerating adds the row, with a TODO the test refuses
    assert f"| {t.TODO} |" in fresh
    assert t.problems(fresh) == [
        "row 'summit' does not say what was checked against the site's documentation"
    ]
