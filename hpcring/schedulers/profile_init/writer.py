"""The draft -> profile YAML: the values, with a comment naming each source and a `# TODO` comment for each
fact no source could give. The result validates as it is."""

from __future__ import annotations

from typing import Any

import yaml

from hpcring.schedulers.profile_init.compose import Draft

SCHEMA_URL = "https://github.com/hpcring/hpcring/schemas/profile.v2.schema.json"


def _flow(value: Any) -> str:
    """One value in YAML flow style (a scalar without the document-end marker safe_dump adds)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def _block(key: str, value: Any, indent: str) -> list[str]:
    """`key: value`; lists of mappings one item a line (flow style), as the built-in profiles write them."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [f"{indent}{key}:", *(f"{indent}  - {_flow(v)}" for v in value)]
    if isinstance(value, dict):
        lines = [f"{indent}{key}:"]
        for k, v in value.items():
            lines += _block(k, v, indent + "  ")
        return lines
    return [f"{indent}{key}: {_flow(value)}"]


def profile_yaml(draft: Draft) -> str:
    """The profile file's text."""
    lines = [
        f"# yaml-language-server: $schema={SCHEMA_URL}",
        f"# Written by `hpcring profiles init` from: {', '.join(draft.sources) or 'nothing it could read'}.",
        "# Lines marked TODO are what it could not find out; the file validates as it is. Check it with",
        "# `hpcring profiles validate FILE` and `hpcring map --profile FILE`.",
        *(f"# Note: {n}" for n in draft.notes),
        "schema_version: 2",
        f"name: {_flow(draft.name)}",
        f"description: {_flow('written by hpcring profiles init; complete the TODO lines')}",
        "node:",
    ]
    for key, value in draft.node.items():
        lines += [f"  # TODO {t}" for t in draft.todo_node if t.split(":", 1)[0] == key]
        lines += _block(key, value, "  ")
    lines.append("site:")
    lines += [f"  # TODO {t}" for t in draft.todo_site]
    for key, value in draft.site.items():
        lines += _block(key, value, "  ")
        if key == "partitions":
            lines += [f"  # TODO {t}" for t in draft.todo_partitions]
    return "\n".join(lines) + "\n"
