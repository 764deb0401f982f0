"""Reading a test's database from the outside, as an operator would with psql.

These helpers open a connection of their own per call (autocommit), so what they see is what
is committed, never a worker's transaction in flight. `support.testdb.Db` binds them to one
database, for the `db` fixture.

What this does not do: it does not use the product's connection code, so a test of that code
does not lean on it; and it does not create rows (see `support.factories`).
"""

from __future__ import annotations

from typing import Any

import psycopg

from support.waiting import wait_for


def query(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement; its rows, or [] for a statement that returns none."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def status_of(url: str, job_id: str) -> str:
    """The job's status as stored."""
    return str(query(url, "SELECT status FROM worker.jobs WHERE id = %s", (job_id,))[0][0])


def counts(url: str) -> dict[str, int]:
    """How many jobs are in each status (statuses with none are absent)."""
    rows = query(url, "SELECT status, count(*) FROM worker.jobs GROUP BY status")
    return {str(s): int(c) for s, c in rows}


def effects(url: str, job_id: str) -> list[str]:
    """What the job's test tasks did, in order (the `effects` table of `testtasks`); [] on a
    database without that table."""
    if not query(url, "SELECT to_regclass('effects')")[0][0]:
        return []
    rows = query(url, "SELECT kind FROM effects WHERE job = %s ORDER BY at", (job_id,))
    return [str(r[0]) for r in rows]


def wait_for_status(url: str, job_id: str, status: str, timeout: float = 30.0) -> None:
    """Wait until the job is in `status`; the failure names the status it was in."""
    wait_for(
        lambda: status_of(url, job_id) == status,
        timeout=timeout,
        message=f"job {job_id} to be {status} (it is {status_of(url, job_id)})",
    )
