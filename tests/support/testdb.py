"""`Db`: a test's database with its helpers bound to it, handed out by the `db` fixture.

def test_a_failed_job_can_be_retried(db):
    job_id = db.insert_job(status="failed", finished_at="sql:now()")
    ...
    db.wait_for_status(job_id, "pending")
"""

from __future__ import annotations

from typing import Any

from support import db, factories


class Db:
    """One database, for the test that owns it: `db.query(...)`, `db.status_of(job_id)`."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        return db.query(self.url, statement, params)

    def status_of(self, job_id: str) -> str:
        return db.status_of(self.url, job_id)

    def counts(self) -> dict[str, int]:
        return db.counts(self.url)

    def effects(self, job_id: str) -> list[str]:
        return db.effects(self.url, job_id)

    def insert_job(self, **columns: object) -> str:
        return factories.insert_job(self.url, **columns)

    def insert_worker(self, **columns: object) -> str:
        return factories.insert_worker(self.url, **columns)  # type: ignore[arg-type]

    def wait_for_status(self, job_id: str, status: str, timeout: float = 30.0) -> None:
        db.wait_for_status(self.url, job_id, status, timeout)
