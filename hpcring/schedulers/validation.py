"""JSON Schema validation with messages a user can act on: the YAML path, the bad value, the allowed values.

jsonschema's own messages ("Additional properties are not allowed ('x' was unexpected)") name neither the path
nor the alternatives, so we rewrite the common cases and keep the first, most specific error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from hpcring.errors import choices, shown, shown_text

SCHEMA_PACKAGE = "hpcring.schedulers"


@cache
def versions(name: str) -> tuple[int, ...]:
    """Schema versions shipped for `name` (`schema/<name>.v<N>.schema.json`), oldest first."""
    prefix, suffix = f"{name}.v", ".schema.json"
    found = []
    for f in resources.files(SCHEMA_PACKAGE).joinpath("schema").iterdir():
        middle = f.name[len(prefix) : -len(suffix)]
        if f.name.startswith(prefix) and f.name.endswith(suffix) and middle.isdigit():
            found.append(int(middle))
    return tuple(sorted(found))


def latest(name: str) -> int:
    """The newest shipped version of a schema (what new files and `profiles init` use)."""
    return versions(name)[-1]


@cache
def load_schema(name: str, version: int = 1) -> dict[str, Any]:
    """A schema shipped as package data (`schema/<name>.v<version>.schema.json`)."""
    data: dict[str, Any] = json.loads(schema_text(name, version))
    return data


def schema_text(name: str, version: int = 1) -> str:
    """The schema file's text, as published for editors."""
    if version not in versions(name):
        raise ValueError(f"no {name} schema version {version}; shipped: {choices(versions(name))}")
    path = resources.files(SCHEMA_PACKAGE).joinpath("schema", f"{name}.v{version}.schema.json")
    return path.read_text("utf-8")


def pick_version(data: object, name: str, where: str, error: Callable[[str], Exception]) -> int:
    """The schema version a document asks for with `schema_version` (v1 documents stay v1).

    A document without one is checked against the newest schema, which then reports the missing key; a version
    this hpcring does not ship is refused, naming the ones it does.
    """
    shipped = versions(name)
    if not isinstance(data, dict) or "schema_version" not in data:
        return shipped[-1]
    asked = data["schema_version"]
    if type(asked) is int and asked in shipped:
        return asked
    raise error(f"{where}: schema_version: {shown(asked)} is not allowed; allowed: {choices(shipped)}")


def yaml_path(parts: Iterable[object]) -> str:
    """Format a jsonschema path deque as `node.gpus[2].numa` (or `(top level)`)."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "(top level)"


def _describe(error: Any) -> str:
    """One-line message for a jsonschema ValidationError, naming the allowed values where there are any."""
    v = error.validator
    inst = error.instance
    if v == "enum":
        return f"{shown(inst)} is not allowed; allowed: {choices(error.validator_value)}"
    if v == "const":
        return f"{shown(inst)} is not allowed; allowed: {shown(error.validator_value)}"
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(inst) - set(allowed), key=str)[:10] if isinstance(inst, dict) else []
        return f"unknown key {choices(extra)}; allowed keys: {choices(allowed)}"
    if v == "required":
        return f"missing {error.message.split(' is a required')[0]}"
    if v == "type":
        return f"{shown(inst)} has the wrong type; expected {choices(_as_list(error.validator_value))}"
    if v == "minimum":
        return f"{shown(inst)} is too small; allowed: {error.validator_value!r} or more"
    if v == "maximum":
        return f"{shown(inst)} is too large; allowed: {error.validator_value!r} or less"
    if v == "maxItems":
        count = len(inst) if isinstance(inst, list) else "?"
        return f"{count} items are too many; allowed: at most {error.validator_value!r}"
    if v == "minItems":
        return f"{shown(inst)} is too short; allowed: at least {error.validator_value!r} item(s)"
    if v == "minLength":
        return f"{shown(inst)} is too short; allowed: at least {error.validator_value!r} character(s)"
    if v == "uniqueItems":
        return f"{shown(inst)} lists an item more than once; list each one once"
    if v == "pattern":
        return f"{shown(inst)} does not match the expected form {error.validator_value!r}"
    if v == "oneOf":
        # Each alternative's own description says what it is; the whole's description is the fallback.
        descs = [s.get("description") for s in error.schema.get("oneOf", []) if isinstance(s, dict)]
        named = [d for d in descs if d]
        hint = " or ".join(named) if len(named) == len(descs) else error.schema.get("description")
        return f"{shown(inst)} is not allowed{'; allowed: ' + hint if hint else ''}"
    if v == "not":
        return "'command' and 'steps' are mutually exclusive; give one of them"
    return shown_text(str(error.message))


def _as_list(value: object) -> Sequence[object]:
    return value if isinstance(value, list) else [value]


def validate(
    data: object,
    schema_name: str,
    where: str,
    error: Callable[[str], Exception],
    label: Callable[[str], str] | None = None,
) -> None:
    """Validate `data` against a shipped schema; raise `error(message)` for the first (deepest) problem.

    `label` renames the YAML path in the message (the CLI names its flag instead of the job file's key), and
    an empty `where` leaves the file name out.
    """
    import jsonschema  # light, but only needed here

    schema = load_schema(schema_name, pick_version(data, schema_name, where, error))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        validator.iter_errors(data), key=lambda e: (-len(e.absolute_path), yaml_path(e.absolute_path))
    )
    if errors:
        first = errors[0]
        # oneOf reports its own children as context; the most specific child helps more when there is one.
        path = shown_text(yaml_path(first.absolute_path))
        prefix = f"{where}: " if where else ""
        raise error(f"{prefix}{label(path) if label else path}: {_describe(first)}")
