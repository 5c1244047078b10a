"""The house's import rules, read from the source (nothing is imported): no cycles, no upward arrows.

No cycle: a module that imports one which (through others) imports it back works only in some import orders,
and cannot be understood or moved on its own. Floors: every module belongs to one floor (FLOORS, lowest
first) and imports only its own floor and the ones below, so a floor can be read, tested and replaced without
those above it. The engine reaches the collective floor only through its door (ENGINE_DOOR).

An edge is any `import`/`from ... import` of an hpcring module, at module level or inside a function (only
`if TYPE_CHECKING:` blocks are left out: they never run); `from pkg import name` is an edge to the submodule
`pkg.name` when there is one, else to `pkg`, so a package's `__init__` importing its own submodules counts
like any other module. `importlib.import_module` with a constant name is an edge; a module that calls it
with a computed name (a registry of modules by name) is taken to import every hpcring module whose full name
stands in it as a string.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcring

PACKAGE_DIR = Path(hpcring.__file__).resolve().parent
# Floors, lowest first: (name, module prefixes). A module may import its own floor and the floors below.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "hpcring.errors",
            "hpcring.config",
            "hpcring._deps",
            "hpcring.version",
            "hpcring.malloc_policy",
            "hpcring.horovod_env",
            "hpcring.contracts",
            "hpcring.files",
            "hpcring.durations",
        ),
    ),
    ("collectives and job scripts", ("hpcring.collective", "hpcring.schedulers")),
    ("engine and launcher", ("hpcring.engine", "hpcring.launch")),
    (
        "frameworks and tools",
        ("hpcring.torch", "hpcring.bench", "hpcring.diagnostics", "hpcring.cray_gtl", "hpcring.elf_needed"),
    ),
    ("executors", ("hpcring.ray", "hpcring.spark", "hpcring.horovod_alias")),
    ("faces", ("hpcring.cli", "hpcring.__main__", "hpcring")),
)
# What the engine may import of the collective floor: the unchecked collectives and the value modules.
ENGINE_DOOR = tuple(
    f"hpcring.collective.{m}" for m in ("kernels", "ops", "dtypes", "arrays", "topology", "stages")
)


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


def floor_of(module: str) -> int:
    """The index in FLOORS of `module`'s floor (the longest matching prefix wins: `hpcring` is the face)."""
    best, found = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    if found < 0:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS in {__file__}")
    return found


def test_no_cycle_anywhere(graph: dict[str, set[str]]) -> None:
    bad = cycles(graph)
    assert not bad, "import cycles:\n" + "\n".join(describe(c, graph) for c in bad)


def test_no_import_goes_up_a_floor(graph: dict[str, set[str]]) -> None:
    up = [
        f"{m} ({FLOORS[floor_of(m)][0]}) imports {d} ({FLOORS[floor_of(d)][0]})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if floor_of(d) > floor_of(m)
    ]
    assert not up, "imports that go up a floor:\n" + "\n".join(up)


def test_the_engine_reaches_the_collectives_through_its_door(graph: dict[str, set[str]]) -> None:
    through = [
        f"{m} imports {d}"
        for m, deps in sorted(graph.items())
        if m.startswith("hpcring.engine")
        for d in sorted(deps)
        if d.startswith("hpcring.collective") and d not in ENGINE_DOOR
    ]
    assert not through, "the engine past its door (collective/kernels.py):\n" + "\n".join(through)


def test_floor_of_takes_the_longest_prefix() -> None:
    assert FLOORS[floor_of("hpcring")][0] == "faces"
    assert FLOORS[floor_of("hpcring.contracts.elastic")][0] == "base"
    assert floor_of("hpcring.engine.engine") > floor_of("hpcring.collective.kernels")
    with pytest.raises(AssertionError, match="on no floor"):
        floor_of("elsewhere.module")
