"""What `connection=` takes, and our statements in a form a caller's connection runs.

A transactional enqueue runs on the caller's own SQLAlchemy connection or session, on the
psycopg or asyncpg driver (`portable` rewrites a `%(name)s` statement for it), or on a plain
psycopg connection, such as Django's (`connection.connection`), which runs our statements as
they are: the adapters of `worker.db.client_async` (and its blocking twin) tell them apart.
The clients type their `connection=` with `SyncTarget` and `AsyncTarget`; the adapters import
their SQLAlchemy types from here, under the names the generated blocking twin expects. Nothing
here opens a connection.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import psycopg
from sqlalchemy import Connection, Result, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

__all__ = [
    "ASYNC_TAKES",
    "SYNC_TAKES",
    "AsyncConnection",
    "AsyncSession",
    "AsyncTarget",
    "Connection",
    "Session",
    "SyncTarget",
    "portable",
    "rows",
]

SyncTarget = Connection | Session | psycopg.Connection[Any] | None
AsyncTarget = AsyncConnection | AsyncSession | psycopg.AsyncConnection[Any] | None

# What each client's `connection=` takes, for the error that names a wrong one.
SYNC_TAKES = (
    "SQLAlchemy Connection or Session, or a psycopg Connection (AsyncClient takes the async ones)"
)
ASYNC_TAKES = (
    "SQLAlchemy AsyncConnection or AsyncSession, or a psycopg AsyncConnection "
    "(Client takes the blocking ones)"
)


@lru_cache(maxsize=8)
def portable(statement: str) -> TextClause:
    """A `%(name)s` statement as a SQLAlchemy text clause, so it runs on the driver of the
    caller's connection (psycopg or asyncpg): its casts are written `CAST(x AS t)`, which
    `text()` leaves alone, unlike `::t` after a parameter."""
    return text(re.sub(r"%\((\w+)\)s", r":\1", statement))


def rows(result: Result[Any], returning: bool) -> list[Any]:
    """The rows of a statement run on a caller's connection (none unless it returns some)."""
    return list(result.all()) if returning else []
