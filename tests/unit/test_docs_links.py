"""Every relative link in README.md and docs/ reaches a file that exists, and its #anchor a heading there.

Pages move (docs/guide/ for users, docs/dev/ for developer records); a link left behind is found here rather
than by a reader. Anchors follow GitHub's rule for heading ids.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from support import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without code blocks and inline code, where brackets are not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped (but `-` and `_`), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text.replace("`", "")).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    ids = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.*)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    return frozenset(ids)


def _links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_pages_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/guide/cli.md", "docs/dev/benchmarks.md"} <= names


def test_slug_follows_github() -> None:
    assert slug("HOROVOD_* variables") == "horovod_-variables"
    assert slug("`hpcring run` in elastic mode") == "hpcring-run-in-elastic-mode"
    assert (
        slug("The house (issue 26, 2026-11-27): one submit path")
        == "the-house-issue-26-2026-11-27-one-submit-path"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that id in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(broken)
