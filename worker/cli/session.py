"""Where the CLI's commands get their settings, their database and their connections.

The settings are read once per command (bad ones exit with code 2); the database is
DATABASE_URL or the embedded default, started on demand. What this does not do: it runs no
statement of its own; commands ask `worker.db.admin` or the client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from worker.cli.errors import CliError, fail
from worker.settings import Settings, load_settings_or_exit

if TYPE_CHECKING:
    from worker.db.admin import Conn

T = TypeVar("T")


def settings() -> Settings:
    """The settings from the environment, or exit 2 naming the bad one."""
    return load_settings_or_exit()


def checked_url(option: str, value: str) -> str:
    """A database URL given as `option`, checked as DATABASE_URL is, or exit 2 naming it."""
    from pydantic import ValidationError

    s = settings()
    try:
        checked = s.model_validate({**s.model_dump(), "database_url": value}).database_url
    except ValidationError as exc:
        message = str(exc.errors()[0].get("msg", "is invalid"))
        raise fail(f"{option}: {message.removeprefix('Value error, ')}", 2) from None
    if checked is None:
        raise fail(f"{option}: must look like postgresql://user:password@host:port/database", 2)
    return checked


def url() -> str:
    """The database's URL: DATABASE_URL, or the embedded server's (started if need be)."""
    from worker.db.embedded import database_url

    return database_url(settings())


def client() -> Any:
    """A blocking client of the database."""
    from worker.client import Client

    return Client(url())


def ask(work: Callable[[Conn], Awaitable[T]], database: str | None = None) -> T:
    """Run one of `worker.db.admin`'s operations (or a few, in `work`) and wait for it."""
    from worker.db.admin import blocking

    return blocking(database or url(), "durable-worker-cli", work)


def ensure_schema(database: str, *, migrate: bool) -> None:
    """Migrate when asked; otherwise insist the schema exists (the embedded default is
    migrated when it starts)."""
    from worker.db import admin
    from worker.db import migrate as migrations

    if migrate:
        migrations.upgrade(database)
        return
    if not admin.blocking(database, "durable-worker", admin.health):
        raise CliError("the worker schema is missing: run `worker migrate` first")
