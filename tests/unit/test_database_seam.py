"""Every face reaches PostgreSQL through the seam, `worker/db/`: no module outside it imports a
driver (psycopg, its pool) or SQLAlchemy's engine, connections, results or errors.

Outside the seam, SQLAlchemy is allowed only for what the schema declares (`worker/schema.py`:
tables, columns, types). Every import counts, wherever it is written: at the top of a module,
inside a function, or under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import worker

WORKER = Path(worker.__file__).parent

# The modules outside the seam that may import SQLAlchemy at all, and only its schema parts.
DECLARES_THE_SCHEMA = {"schema.py"}
# What of SQLAlchemy runs statements, holds connections or reports their errors: the seam's.
# (`text` stays allowed: the schema writes its server defaults with it.)
ENGINE_MODULES = ("sqlalchemy.engine", "sqlalchemy.ext", "sqlalchemy.exc", "sqlalchemy.orm")
ENGINE_NAMES = {
    "AsyncConnection",
    "AsyncEngine",
    "AsyncSession",
    "Connection",
    "Engine",
    "Result",
    "Row",
    "Session",
    "create_async_engine",
    "create_engine",
    "event",
    "exc",
}


def imported(tree: ast.AST) -> Iterator[tuple[str, str | None, int]]:
    """(module, name imported from it or None, line) for every import of another package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                yield node.module, alias.name, node.lineno


def trespasses(root: Path) -> list[str]:
    """Each import of a driver or of SQLAlchemy's engine outside `root/db`, as `file:line`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "db":
            continue
        for module, name, line in imported(ast.parse(path.read_text(encoding="utf-8"))):
            top = module.split(".")[0]
            driver = top in ("psycopg", "psycopg_pool", "psycopg2", "asyncpg")
            alchemy = top == "sqlalchemy" and (
                str(relative) not in DECLARES_THE_SCHEMA
                or module.startswith(ENGINE_MODULES)
                or name in ENGINE_NAMES
            )
            if driver or alchemy:
                found.append(f"{relative}:{line} imports {module}{f'.{name}' if name else ''}")
    return found


def test_no_module_outside_the_seam_imports_a_driver_or_the_engine() -> None:
    assert trespasses(WORKER) == []


def test_the_check_sees_drivers_and_engines_wherever_imported(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "connect.py").write_text("import psycopg\nfrom sqlalchemy import text\n")
    (tmp_path / "client.py").write_text("def f():\n    from psycopg.rows import tuple_row\n")
    (tmp_path / "api.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sqlalchemy.exc\n"
    )
    (tmp_path / "schema.py").write_text(
        "from sqlalchemy import Column, Table\nfrom sqlalchemy import create_engine\n"
    )
    (tmp_path / "cli.py").write_text("from sqlalchemy import Table\n")
    assert trespasses(tmp_path) == [
        "api.py:3 imports sqlalchemy.exc",
        "cli.py:1 imports sqlalchemy.Table",
        "client.py:2 imports psycopg.rows.tuple_row",
        "schema.py:2 imports sqlalchemy.create_engine",
    ]
