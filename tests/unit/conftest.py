"""The fast tier: tests that need no database, no server and no worker fleet, run in seconds.

Every test here runs with `DATABASE_URL` on a port nothing listens on and its data folder in a
temporary directory, so code that connects by accident fails at once instead of finding a
developer's database or starting the embedded server in their home. The database fixtures of
`tests/conftest.py` refuse to start for these tests: a test that needs PostgreSQL belongs in
`tests/`, not here.

    .venv/bin/python -m pytest tests/unit -q
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.db.embedded import LocalPostgres
from worker.settings import get_settings

# Port 1 (tcpmux) is reserved and never served: a connection is refused at once.
CLOSED_DATABASE_URL = "postgresql://unit:unit@127.0.0.1:1/unit"

NO_DATABASE = "tests/unit needs no database; a test that does belongs in tests/"


@pytest.fixture(autouse=True)
def no_database(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Point the settings at a closed port and a temporary data folder, and refuse to start a
    server, for every unit test."""
    monkeypatch.setenv("DATABASE_URL", CLOSED_DATABASE_URL)
    monkeypatch.setenv("WORKER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("TEST_DATABASE_URL", raising=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(NO_DATABASE)

    monkeypatch.setattr(LocalPostgres, "start", refuse)
    get_settings.cache_clear()  # settings read before this test must not leak into it
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def pg_server() -> str:
    """Refuses: the shared test server is not started for the unit tier."""
    pytest.fail(NO_DATABASE)
