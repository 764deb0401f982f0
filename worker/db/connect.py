"""Every connection, pool and engine the package opens is made here.

One place decides how durable-worker talks to PostgreSQL: the libpq options that bound a dead
host or a silently cut network, autocommit, the application name an operator sees in
`pg_stat_activity`, and the pool parameters. The rest of the package asks for a connection
by what it is for (`connect`, `aconnect`, `async_pool`) and never calls psycopg or SQLAlchemy
to open one itself.

Behind a pooler in transaction mode (`DATABASE_POOLER=transaction`) no connection made here
prepares a statement: the next transaction of the same connection may run on another server
session, where the statement is missing or another client's has its name. Notifications then
come from `WORKER_LISTEN_URL`, a direct connection, or not at all (`listen_url`).

What this does not do: it does not decide which database (see `worker.urls`), and it does
not retry; the callers that survive an outage (the daemon's `Patience`, the notifier, the
client's enqueue) each say how.

    with connect(url, "durable-worker-cli") as conn:
        conn.execute("SELECT 1")
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import RowFactory
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.settings import Pooler, get_settings
from worker.urls import sqlalchemy_url

# libpq options used unless the URL sets its own: a dead host fails a connection attempt in
# 10 s instead of the system's minutes. A silently cut connection (no RST: a failed-over virtual
# IP, a dropped route) is noticed in about a minute: by the keepalives when it is idle, and by
# `tcp_user_timeout` when it has data unacknowledged (a statement sent as the cut came), which
# TCP would otherwise retransmit for a quarter of an hour.
CONNECT_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}


# What prepared statements meet behind a transaction pooler the settings do not declare: a
# statement prepared by another client on the same server session, or one of ours missing.
MISPOOLED = (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
POOLER_HINT = (
    "DATABASE_URL leads to a pooler in transaction mode: set DATABASE_POOLER=transaction, and "
    "WORKER_LISTEN_URL to a direct URL for notifications"
)


class PoolerMismatch(psycopg.ProgrammingError):
    """A prepared statement clashed with another client's: `DATABASE_URL` leads to a pooler in
    transaction mode that `DATABASE_POOLER` does not declare."""


def pooled() -> bool:
    """Whether `DATABASE_URL` leads to a pooler in transaction mode (`DATABASE_POOLER`): no
    session state then, not even a prepared statement."""
    return get_settings().database_pooler is Pooler.TRANSACTION


def listen_url(url: str) -> str | None:
    """Where to LISTEN for the notifications of `url`: `WORKER_LISTEN_URL` when set, else `url`
    itself, unless that leads to a pooler in transaction mode (a LISTEN there holds no server
    session, so its notifications are dropped): None, no notifications then."""
    settings = get_settings()
    if settings.listen_url:
        return settings.listen_url
    return None if settings.database_pooler is Pooler.TRANSACTION else url


def connect_options(url: str, application_name: str) -> dict[str, Any]:
    """Keyword arguments for `psycopg.connect` on top of `url` (whose own options win)."""
    given = conninfo_to_dict(url)
    options: dict[str, Any] = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    options["fallback_application_name"] = application_name
    if pooled():
        options["prepare_threshold"] = None
    return options


def _session_options(url: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
    kwargs = {**connect_options(url, name), **options}
    if pooled():  # whatever the caller asked: a prepared statement would meet another client
        kwargs["prepare_threshold"] = None
    return kwargs


def connect(
    url: str,
    name: str,
    *,
    autocommit: bool = True,
    row_factory: RowFactory[Any] | None = None,
    **options: Any,
) -> psycopg.Connection[Any]:
    """A blocking connection named `name` (its `application_name` unless the URL sets one)."""
    kwargs = {**_session_options(url, name, options), "autocommit": autocommit}
    if row_factory is not None:
        kwargs["row_factory"] = row_factory
    return psycopg.connect(url, **kwargs)


async def aconnect(
    url: str, name: str, *, autocommit: bool = True, **options: Any
) -> psycopg.AsyncConnection[Any]:
    """The asyncio `connect`."""
    kwargs = {**_session_options(url, name, options), "autocommit": autocommit}
    return await psycopg.AsyncConnection.connect(url, **kwargs)


def async_pool(
    url: str,
    name: str,
    *,
    min_size: int,
    max_size: int,
    timeout: float,
    reconnect_timeout: float,
    configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    check: bool = False,
) -> AsyncConnectionPool[Any]:
    """An autocommit pool, not opened yet (`await pool.open()`); `name` names its sessions.
    `check`: each connection is tried (one round trip) before it is handed out, so one the
    server dropped while idle is replaced rather than failing its caller."""
    return AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, **connect_options(url, name)},
        configure=configure,
        check=AsyncConnectionPool.check_connection if check else None,
        open=False,
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
        name=name,
    )


def _engine_options(url: str) -> dict[str, Any]:
    # A client's sessions are bounded as the daemon's are: a server that stops answering, or
    # a network that drops without a word, fails a call instead of hanging it.
    return {
        "pool_pre_ping": True,
        "pool_size": 5,
        "max_overflow": 5,
        "connect_args": connect_options(url, "durable-worker-client"),
    }


@lru_cache(maxsize=8)
def sync_engine(url: str) -> Engine:
    """The SQLAlchemy engine of `url`, one per process: the client's reads and admin writes."""
    return create_engine(sqlalchemy_url(url), **_engine_options(url))


@lru_cache(maxsize=8)
def async_engine(url: str) -> AsyncEngine:
    """The asyncio `sync_engine`."""
    return create_async_engine(sqlalchemy_url(url), **_engine_options(url))
