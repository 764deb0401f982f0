"""Where the database is: `DATABASE_URL`, or the embedded server when it is unset."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.db.embedded import LocalPostgres
from worker.settings import Settings, get_settings

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


def connect_options(url: str, application_name: str) -> dict[str, Any]:
    """Keyword arguments for `psycopg.connect` on top of `url` (whose own options win)."""
    given = conninfo_to_dict(url)
    options: dict[str, Any] = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    options["fallback_application_name"] = application_name
    return options


def embedded_server(settings: Settings) -> LocalPostgres:
    """The embedded server of this settings' data folder (not started)."""
    return LocalPostgres(Path(settings.data_dir) / "pg")


@lru_cache(maxsize=8)
def _embedded_url(data_dir: str) -> str:
    # Migrated on first use, so trying durable-worker needs no `worker migrate` step.
    return LocalPostgres(Path(data_dir) / "pg").start_migrated()


def database_url(settings: Settings | None = None) -> str:
    """The libpq URL to connect to, starting the embedded server when `DATABASE_URL` is unset."""
    settings = settings or get_settings()
    if settings.database_url:
        return psycopg_url(settings.database_url)
    return _embedded_url(settings.data_dir)


def psycopg_url(url: str) -> str:
    """`postgresql+psycopg://...` or `postgres://...` as a plain libpq URL."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def sqlalchemy_url(url: str) -> str:
    return re.sub(r"^postgresql://", "postgresql+psycopg://", psycopg_url(url))


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and error messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


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
    return create_engine(sqlalchemy_url(url), **_engine_options(url))


@lru_cache(maxsize=8)
def async_engine(url: str) -> AsyncEngine:
    return create_async_engine(sqlalchemy_url(url), **_engine_options(url))
