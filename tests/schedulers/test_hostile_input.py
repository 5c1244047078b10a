"""Hostile files and sizes: YAML anchor bombs and duplicate keys, values quoted whole into errors, counts that
would size the mapping. Each is refused at once with one short line naming the field and the bound."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcring.cli.run import _np
from hpcring.config import MAX_RANKS
from hpcring.errors import SHOWN_CHARS, ConfigError, ProfileError, shown
from hpcring.schedulers import job, profile, safe_yaml, textfile
from hpcring.schedulers.profile import MAX_PARTITIONS

SHORT = 400  # an error line quoting a value: the value's 200 characters and the words around them


def bomb(depth: int, fan: int = 9) -> str:
    """The "billion laughs": each level an anchored list of `fan` aliases of the level before."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("depth", [8, 9])
def test_an_anchor_bomb_is_refused_without_expanding_it(depth: int, tmp_path: Path) -> None:
    text = bomb(depth)
    assert len(text) < 2048
    with pytest.raises(safe_yaml.RefusedYaml, match=f"past {safe_yaml.ALIAS_BUDGET} extra nodes"):
        safe_yaml.load(text)
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as as_profile:
        profile.load(str(path))
    with pytest.raises(ConfigError) as as_job:
        job.load(path)
    for err in (as_profile.value, as_job.value):
        assert "anchor bomb" in str(err) and len(str(err)) < SHORT and "\n" not in str(err)


def test_aliases_within_the_budget_and_merges_still_load() -> None:
    text = "base: &b {cores: 4, gpus: [0, 1]}\nnode:\n  <<: *b\n  cores: 8\ncopy: *b\n"
    assert safe_yaml.load(text) == yaml.safe_load(text)
    assert safe_yaml.load(bomb(3)) == yaml.safe_load(bomb(3))  # 9^3 = 729 leaves: within the budget
    with pytest.raises(safe_yaml.RefusedYaml, match="refers to the node that contains it"):
        safe_yaml.load("a: &a [1, *a]\n")


def test_a_duplicate_key_is_refused_naming_it_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("nodes: 2\ncommand: [python, t.py]\nsteps_x: 1\nnodes: 4\n")
    with pytest.raises(ConfigError, match=r"line 4: duplicate key 'nodes' \(first at line 1\)"):
        job.load(path)
    nested = "scheduler: slurm\nnode:\n  sockets: 1\n  sockets: 2\n"
    with pytest.raises(
        ProfileError, match=r"p.yaml: not valid YAML: line 4: duplicate key 'sockets' \(first"
    ):
        profile.parse(nested, "p.yaml")


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=30,
    )
)
def test_any_plain_document_loads_as_safe_load_does(data: object) -> None:
    text = yaml.safe_dump(data)
    assert safe_yaml.load(text) == yaml.safe_load(text)


@settings(max_examples=80, deadline=None)
@given(
    st.recursive(
        st.text() | st.integers() | st.binary(), lambda k: st.lists(k) | st.dictionaries(st.text(), k)
    )
)
def test_a_value_in_an_error_is_at_most_200_characters(value: object) -> None:
    assert len(shown(value)) <= SHOWN_CHARS


def test_errors_quote_at_most_200_characters_of_a_value(tmp_path: Path) -> None:
    huge = "x" * 1_000_000
    with pytest.raises(ConfigError) as wrong_type:
        job.check({"nodes": huge}, "job.yaml")
    with pytest.raises(ConfigError) as not_allowed:
        job.check({"nodes": 1, "command": ["t"], huge: 1}, "job.yaml")
    with pytest.raises(ProfileError) as bad_enum:
        profile.parse(f"schema_version: 1\nname: p\nsite:\n  scheduler: {huge}\n", "p.yaml")
    for err in (wrong_type.value, not_allowed.value, bad_enum.value):
        assert len(str(err)) < SHORT + 200, str(err)[:500]  # with the allowed values listed
        assert "xxx..." in str(err)


def test_counts_are_bounded_before_anything_is_sized_by_them(capsys: pytest.CaptureFixture[str]) -> None:
    from hpcring.cli import main

    assert main(["map", "--profile", "local", "--nodes", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "--nodes [HPCRING_NODES]: 100000000 is too large; allowed: 262144 or less" in err
    assert main(["render", "--profile", "generic-lsf", "--nodes", "100000000", "--", "true"]) == 2
    assert "allowed: 262144 or less" in capsys.readouterr().err
    assert main(["map", "--profile", "frontier", "--nodes", "9408", "--ranks-per-node", "4096"]) == 2
    assert f"allowed: at most {MAX_RANKS} ranks" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=f"-np must be at most {MAX_RANKS}, got 100000000"):
        _np(argparse.Namespace(np="100000000", min_np=None))


def test_a_profile_with_too_many_partitions_or_bytes_is_refused(tmp_path: Path) -> None:
    parts = "".join(f"    - {{name: p{i}}}\n" for i in range(MAX_PARTITIONS + 1))
    text = f"site:\n  scheduler: slurm\n  partitions:\n{parts}"
    with pytest.raises(
        ProfileError, match=f"site.partitions: {MAX_PARTITIONS + 1} are too many; allowed: at most"
    ):
        profile.parse(text, "p.yaml")
    big = tmp_path / "big.yaml"  # a million partitions: refused unread
    with big.open("w") as f:
        f.write("scheduler: slurm\npartitions:\n")
        f.writelines(f"  - {{name: p{i}}}\n" for i in range(1_000_000))
    with pytest.raises(ProfileError, match=f"is larger than {textfile.MAX_BYTES} bytes, the most allowed"):
        profile.load(str(big))
