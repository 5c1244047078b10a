"""No import cycles in hpcring: a module that imports one which (through others) imports it back works only
in some import orders, and cannot be understood or moved on its own.

The graph is read from the source (nothing is imported). An edge is any `import`/`from ... import` of an
hpcring module, at module level or inside a function (only `if TYPE_CHECKING:` blocks are left out: they never
run); `from pkg import name` is an edge to the submodule `pkg.name` when there is one, else to `pkg`, so a
package's `__init__` importing its own submodules counts like any other module. `importlib.import_module`
with a constant name is an edge; a module that calls it with a computed name (a registry of modules by name)
is taken to import every hpcring module whose full name stands in it as a string.

Every cycle must be listed in KNOWN_CYCLES (as its strongly connected component: the modules that import
each other round), and none may touch STRICT. A new or grown cycle fails, and so does a listed one that is
gone (take it off the list). To check a whole package strictly, add it to STRICT once its cycles are gone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcring

PACKAGE_DIR = Path(hpcring.__file__).resolve().parent
# Packages where no cycle is allowed, not even a listed one.
STRICT = ("hpcring.schedulers", "hpcring.cli")
# Cycles that were there when this check was written, outside STRICT: why each exists. Remove an entry when
# its cycle is gone; never add one to silence the check.
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset(
        {
            "hpcring.torch",
            "hpcring.torch.autotune",
            "hpcring.torch.elastic",
            "hpcring.torch.elastic.common",
            "hpcring.torch.elastic.runner",
            "hpcring.torch.elastic.sampler",
            "hpcring.torch.elastic.state",
            "hpcring.torch.functions",
            "hpcring.torch.optimizer",
            "hpcring.torch.sync_batch_norm",
        }
    ): "hpcring.torch re-exports its submodules' API, and functions, optimizer, sync_batch_norm and "
    "elastic.* import `hpcring.torch` (as hvd) back, inside functions, to call that API",
}


def module_names(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (`pkg/__init__.py` is `pkg`)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` (at `path`) imports."""

    def known(dotted: str) -> str | None:
        """`dotted` or its nearest enclosing module of the package."""
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text("utf-8"), str(path))
    found: set[str | None] = set()
    dynamic = False
    strings: set[str] = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            found.update(known(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add(sub if sub in modules else known(target))
        elif isinstance(node, ast.Call) and _is_import_module(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(known(arg.value))
            else:
                dynamic = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            strings.add(node.value)
    if dynamic:
        found.update(strings)
    return {m for m in found if m is not None and m != name}


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    """A shortest cycle through the component's first module, as `a -> b -> a`, and the component."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = [start]
    for node in queue:  # breadth first: the first way back to `start` is a shortest one
        if start in graph[node]:
            path = [node]
            while path[-1] != start:
                path.append(came_from[path[-1]])
            return " -> ".join([*reversed(path), start]) + f"  (component: {', '.join(sorted(component))})"
        for nxt in sorted(graph[node] & component):
            if nxt not in came_from and nxt != start:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in no cycle")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_cycle_touches_the_strict_packages(graph: dict[str, set[str]]) -> None:
    bad = [c for c in cycles(graph) if any(m.startswith(STRICT) for m in c)]
    assert not bad, "import cycles:\n" + "\n".join(describe(c, graph) for c in bad)


def test_every_cycle_elsewhere_is_a_known_one(graph: dict[str, set[str]]) -> None:
    found = set(cycles(graph))
    new = [c for c in found if c not in KNOWN_CYCLES]
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not new, "new import cycles:\n" + "\n".join(describe(c, graph) for c in new)
    assert not gone, "cycles gone (remove them from KNOWN_CYCLES):\n" + "\n".join(
        ", ".join(sorted(c)) for c in gone
    )
    assert not any(m.startswith(STRICT) for c in KNOWN_CYCLES for m in c)


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\n",  # a package importing its own submodule
        "a.py": "def f():\n    from . import b\n",  # function level, relative
        "b.py": "import importlib\nimportlib.import_module('pkg.sub.c')\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import pkg.d\n"
        "from pkg import x\n",
        "d.py": "import importlib\n"
        "TABLE = {'c': 'pkg.sub.c'}\n"
        "def get(k):\n    return importlib.import_module(TABLE[k])\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg"},  # `from pkg import x`: x is no module, so the package; TYPE_CHECKING skipped
        "pkg.d": {"pkg.sub.c"},  # a registry of modules by name
    }
    (component,) = cycles(graph)
    assert component == {"pkg", "pkg.a", "pkg.b", "pkg.sub.c"}
    assert describe(component, graph).startswith("pkg -> pkg.a -> pkg.b -> pkg.sub.c -> pkg  (component: ")
