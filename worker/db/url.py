"""Where the database is: `DATABASE_URL`, or the embedded server when it is unset."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from worker.db.embedded import LocalPostgres
from worker.settings import Settings, get_settings


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
    """The URL as SQLAlchemy names psycopg 3's dialect."""
    return re.sub(r"^postgresql://", "postgresql+psycopg://", psycopg_url(url))


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and error messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
