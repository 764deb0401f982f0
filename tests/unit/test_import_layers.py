"""The import graph of `worker/`: every import points down the layers, and none closes a circle.

Every import counts, wherever it is written: at the top of a module, inside a function, or under
`TYPE_CHECKING`; each is a dependency a reader has to follow. A room is a top-level module or
package of `worker` (`worker/__init__.py`, the public facade, is the room `worker`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import worker

WORKER = Path(worker.__file__).parent

# Top to bottom: a room imports only rooms of the layers below its own. Rooms of one layer do not
# import each other. A new room is placed here on purpose.
LAYERS = [
    {"__main__", "contrib"},
    {"cli"},
    {"demo"},
    {"bench"},
    {"api"},
    {"testing"},
    {"worker"},
    {"daemon"},
    {"middleware"},
    {"stages", "workflow"},
    {"tasks"},
    {"schedules"},
    {"attempt"},
    {"client", "events", "metrics"},
    {"retries", "tracing", "encoding"},
    {"db"},
    {"settings"},
    {"cron", "ids", "schema", "models", "logs", "urls", "progress_bar"},
]

# The imports allowed to close a circle, each with its reason: none.
CIRCLE_ALLOWED: set[tuple[str, str]] = set()

Edge = tuple[str, str]


def modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module of the package under `root`: its dotted name, its file, whether a package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports(root: Path, package: str) -> Iterator[tuple[str, str, int]]:
    """(importer, imported module of the package, line) for every import statement."""
    known = modules(root, package)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for name, (path, is_package) in known.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{parent}.{base}" if base else parent
                # `from pkg import mod` imports the module `pkg.mod`; `from mod import name`, `mod`.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                if target == package or target.startswith(package + "."):
                    resolved = resolve(target)
                    if resolved is not None and resolved != name:
                        yield name, resolved, node.lineno


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def back_arrows(edges: list[tuple[str, str, int]], layers: list[set[str]]) -> list[str]:
    """Imports that point up the layers or across one, as `importer:line -> imported`."""
    rank = {r: i for i, rooms in enumerate(layers) for r in rooms}
    return [
        f"{a}:{line} -> {b}"
        for a, b, line in edges
        if room(a) != room(b) and rank[room(b)] <= rank[room(a)]
    ]


def circles(edges: set[Edge]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_room_of_the_package_has_its_layer() -> None:
    rooms = {room(name) for name in modules(WORKER, "worker")}
    placed = set().union(*LAYERS)
    assert rooms - placed == set(), "place each new room in LAYERS"
    assert placed - rooms == set(), "a room in LAYERS that no longer exists"


def test_every_import_points_down_the_layers() -> None:
    assert back_arrows(list(imports(WORKER, "worker")), LAYERS) == []


def test_no_import_closes_a_circle() -> None:
    edges = {(a, b) for a, b, _ in imports(WORKER, "worker")}
    assert edges >= CIRCLE_ALLOWED, "an allowed import that is gone: remove it from the list"
    assert circles(edges - CIRCLE_ALLOWED) == []


def test_the_checks_see_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("from pkg.low import base\n")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("def f():\n    from pkg import high\n")
    (package / "low" / "other.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .base import f\n"
    )
    edges = list(imports(package, "pkg"))
    assert sorted(edges) == [
        ("pkg.high", "pkg.low.base", 1),
        ("pkg.low.base", "pkg.high", 2),
        ("pkg.low.other", "pkg.low.base", 3),
    ]
    assert back_arrows(edges, [{"high"}, {"low"}]) == ["pkg.low.base:2 -> pkg.high"]
    assert circles({(a, b) for a, b, _ in edges}) == [["pkg.high", "pkg.low.base"]]
