"""Validating an MPIJob manifest against the MPIJob CRD's own OpenAPI v3 schema, shipped as package data
(`schema/mpijob.v2beta1.crd.json`, source and licence in `schema/mpijob.v2beta1.NOTICE`).

The API server checks more than the schema's keywords, and so does this module: unknown fields are errors (as
`kubectl apply` reports them with its default strict field validation, where the schema alone would let the
server prune them silently), keyed lists (`x-kubernetes-list-type: map`) must not repeat a key, and the object
metadata the CRD leaves open must name the object as the operator needs (the MPIJob's name is its Service's).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from hpcring.errors import ConfigError, shown_text
from hpcring.schedulers.kubernetes_batch import API_VERSION, KIND
from hpcring.schedulers.validation import yaml_path

SCHEMA_FILE = "mpijob.v2beta1.crd.json"
REPLICA_TYPES = ("Launcher", "Worker")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@cache
def crd_document() -> dict[str, Any]:
    """The shipped file: `openAPIV3Schema` plus where it came from (`x-source`)."""
    text = resources.files("hpcring.schedulers").joinpath("schema", SCHEMA_FILE).read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _strict(node: Any) -> Any:
    """A copy of the schema where objects with listed properties refuse any other field."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def strict_schema() -> dict[str, Any]:
    schema: dict[str, Any] = _strict(copy.deepcopy(crd_document()["openAPIV3Schema"]))
    return schema


def _list_key_errors(obj: Any, schema: dict[str, Any], path: tuple[object, ...]) -> Iterator[str]:
    """Repeated keys in lists the schema marks `x-kubernetes-list-type: map` (or `set`)."""
    if isinstance(obj, list):
        kind = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: set[str] = set()
        for i, item in enumerate(obj):
            if kind == "map" and isinstance(item, dict):
                key = json.dumps([item.get(k) for k in keys])
            elif kind == "set":
                key = json.dumps(item, sort_keys=True)
            else:
                key = None
            if key is not None:
                if key in seen:
                    by = ", ".join(keys) if kind == "map" else "the whole item"
                    yield f"{yaml_path((*path, i))}: repeats {key} of a list keyed by {by}"
                seen.add(key)
            yield from _list_key_errors(item, schema.get("items", {}), (*path, i))
    elif isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            sub = props.get(k, extra if isinstance(extra, dict) else {})
            yield from _list_key_errors(v, sub, (*path, k))


def _metadata_errors(obj: dict[str, Any]) -> Iterator[str]:
    if obj.get("apiVersion") != API_VERSION:
        yield f"apiVersion: {obj.get('apiVersion')!r} is not allowed; allowed: {API_VERSION!r}"
    if obj.get("kind") != KIND:
        yield f"kind: {obj.get('kind')!r} is not allowed; allowed: {KIND!r}"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        yield "metadata: missing"
        return
    name = meta.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        yield f"metadata.name: {name!r} is not a DNS-1035 label (lowercase letters, digits, '-', 63 at most)"
    ns = meta.get("namespace")
    if ns is not None and (not isinstance(ns, str) or not _NAMESPACE.match(ns)):
        yield f"metadata.namespace: {ns!r} is not a DNS-1123 label"
    for field in ("labels", "annotations"):
        values = meta.get(field, {})
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            yield f"metadata.{field}: every value must be a string"
    specs = obj.get("spec", {}).get("mpiReplicaSpecs", {}) if isinstance(obj.get("spec"), dict) else {}
    for key in specs if isinstance(specs, dict) else ():
        if key not in REPLICA_TYPES:
            yield f"spec.mpiReplicaSpecs.{key}: unknown replica type; allowed: {', '.join(REPLICA_TYPES)}"
    launcher = specs.get("Launcher") if isinstance(specs, dict) else None
    if not isinstance(launcher, dict) or launcher.get("replicas", 1) != 1:
        yield "spec.mpiReplicaSpecs.Launcher: required, with replicas 1"


def errors(obj: Any) -> list[str]:
    """Every problem of `obj` as an MPIJob, one line each (empty: valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(strict_schema())
    found = [
        f"{shown_text(yaml_path(e.absolute_path))}: {shown_text(e.message)}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: yaml_path(e.absolute_path))
    ]
    if isinstance(obj, dict):
        found += list(_metadata_errors(obj))
        found += list(_list_key_errors(obj, crd_document()["openAPIV3Schema"], ()))
    return found


def validate(obj: Any) -> None:
    """Raise ConfigError naming the first problem when `obj` is not a valid MPIJob."""
    found = errors(obj)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(f"rendered MPIJob does not match the {KIND} CRD ({API_VERSION}): {found[0]}{more}")
