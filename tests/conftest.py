"""Test setup: a real PostgreSQL for every test, started by the tests themselves.

Each pytest-xdist process starts one throwaway server (from the local server binaries, or the
embedded `pgserver` ones) unless `TEST_DATABASE_URL` names an existing server. Every test gets
a fresh database cloned from a migrated template, so tests run in parallel without sharing
rows. Worker processes started by a test are killed when it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from worker.db import migrate
from worker.db.embedded import LocalPostgres

ROOT = Path(__file__).resolve().parents[1]
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
    base = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_")}
    return {
        **base,
        "DATABASE_URL": database_url,
        "WORKER_POLL_MIN": "0.02",
        "WORKER_POLL_MAX": "0.5",
        "WORKER_RETRY_BACKOFF_BASE": "0.05",
        "WORKER_RETRY_BACKOFF_MAX": "0.5",
        "WORKER_LEASE_SECONDS": "3",
        "WORKER_SHUTDOWN_GRACE": "5",
        "WORKER_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
    }


class Processes:
    """Worker processes started by a test; all are killed when the test ends."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(
        self,
        env: dict[str, str],
        *modules: str,
        extra: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "run", *modules, *args],
            env={**env, **(extra or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp_path,
            start_new_session=True,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text()  # type: ignore[attr-defined]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with_suppress_kill(proc)
        for proc in self.procs:
            proc.wait(timeout=10)


def with_suppress_kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> object:
    """Poll until `predicate()` is truthy; fail the test with `message` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


def query(url: str, statement: str, params: object = None) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []
