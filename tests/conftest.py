"""Test setup: a real PostgreSQL for every test, started by the tests themselves.

Each pytest-xdist process starts one throwaway server (from the local server binaries, or the
embedded `pgserver` ones) unless `TEST_DATABASE_URL` names an existing server. Every test gets
a fresh database cloned from a migrated template, so tests run in parallel without sharing
rows. Worker processes started by a test are killed when it ends.

The fixtures are here; the helpers behind them (queries, waiting, row factories, worker
processes) are in `tests/support/`, which test modules import from (`from support import
query, wait_for`). The servers start only for a test that asks for a database: the unit tier
(`tests/unit/`) refuses to.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support import Db, Processes, worker_env

from worker.db import migrate
from worker.db.embedded import LocalPostgres

TEMPLATE = "worker_template"


def _admin_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/postgres"


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a server this test process may create databases on (ends in /postgres)."""
    given = os.environ.get("TEST_DATABASE_URL")
    if given:
        yield _admin_url(given)
        return
    root = Path(tempfile.mkdtemp(prefix="dw-test-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "pg", durable=False, max_connections=300, prefer_system=True)
    server.start()
    try:
        yield server.url("postgres")
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    name = f"{TEMPLATE}_{os.getpid()}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_server.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        # Side effects of test tasks (tests/testtasks.py), counted by the tests.
        conn.execute("CREATE TABLE effects (job text, kind text, at timestamptz DEFAULT now())")
    return name


@pytest.fixture
def database_url(pg_server: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db(database_url: str) -> Db:
    """This test's database with the helpers bound to it: `db.query`, `db.status_of`,
    `db.insert_job`, `db.wait_for_status`."""
    return Db(database_url)


@pytest.fixture
def empty_database_url(pg_server: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = f"e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for `worker` subprocesses: this test's database, quick timings."""
    return worker_env(database_url, WORKER_DATA_DIR=str(tmp_path / "data"))


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()
