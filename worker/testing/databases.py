"""Fresh, migrated databases for tests: the `worker_database` fixture and the server behind it.

The databases live on the server `TEST_DATABASE_URL` names (the role needs `CREATEDB`), or
else on a throwaway PostgreSQL started once per test session in a temporary folder (the
embedded server's binaries, with fsync off) and stopped at its end. Each test's database is
cloned from a template migrated once per session, which costs a file copy instead of a run of
the migrations, and is dropped after the test.

What this does not do: it does not run jobs (`worker.testing.drain` does), nor isolate tests
that share one database on purpose.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import worker.client
from worker.db import migrate
from worker.db.databases import create_database, drop_database
from worker.db.embedded import LocalPostgres
from worker.settings import get_settings
from worker.urls import psycopg_url


def on_database(url: str, name: str) -> str:
    """`url` with its database replaced by `name` (host, role and options kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


class Databases:
    """Migrated databases made on demand on one server, each cloned from a template."""

    def __init__(self, server_url: str) -> None:
        self.server_url = psycopg_url(server_url)  # any database the role can connect to
        self.template: str | None = None

    def _template(self) -> str:
        if self.template is None:
            name = f"dw_template_{uuid.uuid4().hex[:12]}"
            create_database(self.server_url, name)
            migrate.upgrade(on_database(self.server_url, name))
            self.template = name
        return self.template

    def create(self) -> str:
        """The URL of a new database with the `worker` schema at the latest migration."""
        name = f"dw_test_{uuid.uuid4().hex[:12]}"
        create_database(self.server_url, name, template=self._template())
        return on_database(self.server_url, name)

    def drop(self, url: str) -> None:
        """Drop the database of `url`, closing the sessions still on it."""
        name = urlsplit(url).path.lstrip("/")
        drop_database(self.server_url, name)

    def close(self) -> None:
        if self.template is not None:
            self.drop(on_database(self.server_url, self.template))
            self.template = None


@contextlib.contextmanager
def databases_for_tests() -> Iterator[Databases]:
    """Databases on `TEST_DATABASE_URL`'s server, or on a throwaway one stopped at the end."""
    given = os.environ.get("TEST_DATABASE_URL")
    if given:
        databases = Databases(given)
        try:
            yield databases
        finally:
            databases.close()
        return
    root = Path(tempfile.mkdtemp(prefix="durable-worker-test-"))
    root.chmod(0o755)  # run as root, the server's own account must reach its folder
    server = LocalPostgres(root / "pg", durable=False, max_connections=200)
    try:
        server.start()
        yield Databases(server.url("postgres"))
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)


def _reset_clients() -> None:
    """Forget the settings and the default client, which were made for another database."""
    get_settings.cache_clear()
    client, worker.client._default = worker.client._default, None
    if client is not None:
        client.close()


@pytest.fixture(scope="session")
def worker_database_server() -> Iterator[Databases]:
    """The server the `worker_database` fixture makes its databases on, for the session."""
    with databases_for_tests() as databases:
        yield databases


@pytest.fixture
def worker_database(worker_database_server: Databases) -> Iterator[str]:
    """A fresh, migrated database for this test; its URL, also set as `DATABASE_URL`.

    `enqueue`, `Job.get` and `drain` use it with no argument: the settings are read again and
    the default client is made anew for it, and both are forgotten after the test.

        def test_resize(worker_database):
            job = enqueue("resize", {"image": "cat.png"})
            drain()
            assert job.refresh().status == JobStatus.COMPLETED
    """
    url = worker_database_server.create()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", url)
        _reset_clients()
        try:
            yield url
        finally:
            _reset_clients()
    get_settings.cache_clear()  # nor may settings read with the URL outlive the test
    worker_database_server.drop(url)
