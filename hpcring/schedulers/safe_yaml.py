"""Loading a user's YAML (profiles, job files, Horovod's config file) as hostile input.

`yaml.safe_load` builds no objects from tags, but it takes an anchor bomb (a 2 KB file whose aliases expand to
10^9 nodes: the first error that quotes a value prints all of them) and duplicate keys (the last one wins,
silently). Here the composed document, where an alias is still one shared node, is weighed before anything is
built from it: aliases may add at most ALIAS_BUDGET nodes, recursive ones none; and a mapping that names a key
twice is refused, naming the key and both lines. Errors are yaml.YAMLError, so callers keep one `except`.
"""

from __future__ import annotations

from typing import IO, Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

ALIAS_BUDGET = 10_000  # nodes that aliases may add to a document (a site's anchors add tens)

_MERGE = "tag:yaml.org,2002:merge"
_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when the wheel has it


class RefusedYaml(yaml.YAMLError):
    """A document refused for its shape (an anchor bomb, a duplicate key), not its syntax."""


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _unique(root: Node) -> int:
    """How many distinct nodes the composed document has (an alias is the node it names)."""
    seen = {id(root)}
    todo = [root]
    while todo:
        for child in _children(todo.pop()):
            if id(child) not in seen:
                seen.add(id(child))
                todo.append(child)
    return len(seen)


def check_expansion(root: Node, budget: int = ALIAS_BUDGET) -> None:
    """Refuse a document whose aliases, expanded, add more than `budget` nodes, or refer to themselves.

    Each distinct node is weighed once (post-order, no recursion), so a bomb is refused after looking at its
    few hundred distinct nodes, without expanding anything."""
    limit = _unique(root) + budget
    weight: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            total = 1 + sum(weight[id(c)] for c in _children(node))
            if total > limit:
                raise RefusedYaml(
                    f"line {_line(node)}: aliases expand this document past {budget} extra nodes (an anchor "
                    "bomb?); write the values out instead of repeating aliases"
                )
            weight[key] = total
        elif key not in weight:
            if key in active:
                raise RefusedYaml(f"line {_line(node)}: an alias refers to the node that contains it")
            active.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in weight)


class _Loader(_Base):  # type: ignore[misc]
    """The safe loader, with the document weighed before construction and duplicate keys refused."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return self.construct_document(node)

    def construct_mapping(self, node: Node, deep: bool = False) -> Any:
        if isinstance(node, MappingNode):
            first: dict[Any, int] = {}
            for key_node, _value in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE:
                    continue  # a merge (`<<: *defaults`) may override keys: that is what it is for
                key = self.construct_object(key_node)
                if key in first:
                    shown = str(key)[:200]
                    raise RefusedYaml(
                        f"line {_line(key_node)}: duplicate key {shown!r} (first at line {first[key]}); give "
                        "each key once"
                    )
                first[key] = _line(key_node)
        return super().construct_mapping(node, deep)


def load(stream: str | bytes | IO[str] | IO[bytes]) -> Any:
    """The one document in `stream`, built as `yaml.safe_load` does, or RefusedYaml/yaml.YAMLError.
    A document nested deeper than Python's recursion allows is an error too, not a RecursionError."""
    loader = _Loader(stream)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise RefusedYaml("the document is nested too deeply") from None
    finally:
        loader.dispose()
