"""The console's reads and the rollup the workers write, as named operations on typed rows.

Each runs on a psycopg `AsyncConnection` the caller holds: the HTTP edge's pooled ones, or
the `rollup` duty's own. The statements live in `worker.db.sql.console`, each with why it is
safe. The ones that take a tab or a verb as a parameter run unprepared (`prepare=False`): each
run is planned for its own tab, so a plan kept from one tab never serves another. What this
does not do: it changes no job (a bulk verb reads its set here, then calls the client for each
job).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from worker.db.admin import Conn, JobRow, _rows
from worker.db.driver import StagePlans
from worker.db.sql import console as sql


class Tab(enum.StrEnum):
    """A tab of the console's job list: a job's state as an operator reads it."""

    RUNNING = "running"
    QUEUED = "queued"  # due now, never failed
    SCHEDULED = "scheduled"  # not due yet
    RETRYING = "retrying"  # pending again after a failed attempt
    PAUSED = "paused"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    ALL = "all"


class BulkVerb(enum.StrEnum):
    """What a bulk action does to each job of its set."""

    RETRY = "retry"
    CANCEL = "cancel"


# The tabs counted for the list's header; the finished ones but `failed` are not.
COUNTED_TABS = (Tab.RUNNING, Tab.QUEUED, Tab.SCHEDULED, Tab.RETRYING, Tab.PAUSED, Tab.FAILED)


@dataclass(frozen=True)
class ConsoleFilter:
    """Which jobs a tab shows: None skips a filter; `q` is a substring searched for."""

    tab: Tab = Tab.ALL
    q: str | None = None
    queue: str | None = None
    task: str | None = None
    since: datetime | None = None

    def params(self, **more: Any) -> dict[str, Any]:
        return {"q": self.q, "queue": self.queue, "task": self.task, "since": self.since, **more}


@dataclass(frozen=True)
class ConsoleJobRow(JobRow):
    """One row of the console's list: a `JobRow`, with its retry limit, whether a cancel was
    asked, and its holder's host and pid."""

    max_retries: int | None
    cancel_requested: bool
    worker_host: str | None
    worker_pid: int | None


@dataclass(frozen=True)
class JobContext:
    """What the job view adds to a job: its holder, and its task's stages if a worker said."""

    task: str
    worker_id: UUID | None
    worker_host: str | None
    worker_pid: int | None
    heartbeat_age: float | None
    stages: list[str] | None
    cleanups: list[str] | None
    retry_limit: int | None  # the job's own, else its task's as published; None if unknown


@dataclass(frozen=True)
class ConsoleWorkerRow:
    """A registered worker with the jobs it holds (`id`, `task`, `queue`, `started_at`)."""

    id: UUID
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_age: float
    jobs: list[dict[str, Any]]


@dataclass(frozen=True)
class ChartRow:
    """One bucket of one queue: its outcomes, and its deepest minute."""

    bucket: datetime
    queue: str
    completed: int
    failed: int
    pending: int
    processing: int


def _keyset(before_at: datetime | None, before_id: str | None) -> dict[str, Any]:
    return {"before_at": before_at, "before_id": before_id}


async def list_jobs(
    conn: Conn,
    where: ConsoleFilter,
    *,
    limit: int,
    before_at: datetime | None = None,
    before_id: str | None = None,
) -> list[ConsoleJobRow]:
    """Up to `limit` jobs of the tab, newest first, plus one more when more follow."""
    params = where.params(tab=where.tab.value, limit=limit + 1, **_keyset(before_at, before_id))
    async with conn.cursor(row_factory=class_row(ConsoleJobRow)) as cur:
        await cur.execute(sql.LIST_JOBS, params, prepare=False)
        return await cur.fetchall()


async def count_tabs(conn: Conn, where: ConsoleFilter) -> dict[Tab, int]:
    """How many jobs each counted tab holds under the filter's search (its tab aside)."""
    cur = await conn.execute(sql.COUNT_TABS, where.params())
    row = await cur.fetchone()
    assert row is not None  # an aggregate always answers
    return {tab: int(n) for tab, n in zip(COUNTED_TABS, row, strict=True)}


async def count_bulk(conn: Conn, where: ConsoleFilter, verb: BulkVerb) -> int:
    """How many jobs of the filter `verb` would change."""
    params = where.params(tab=where.tab.value, verb=verb.value)
    row = await (await conn.execute(sql.BULK_COUNT, params, prepare=False)).fetchone()
    return int(row[0]) if row else 0


async def bulk_batch(
    conn: Conn,
    where: ConsoleFilter,
    verb: BulkVerb,
    *,
    limit: int,
    before: tuple[datetime, str] | None,
) -> list[tuple[str, datetime]]:
    """The next `limit` ids of the set `verb` may change, after `before` (keyset)."""
    before_at, before_id = before if before is not None else (None, None)
    params = where.params(tab=where.tab.value, verb=verb.value, limit=limit)
    params.update(_keyset(before_at, before_id))
    rows = await (await conn.execute(sql.BULK_IDS, params, prepare=False)).fetchall()
    return [(job_id, created_at) for job_id, created_at in rows]


async def job_context(conn: Conn, job_id: str) -> JobContext | None:
    """The job's holder and its task's stages; None when there is no such job."""
    rows = await _rows(conn, JobContext, sql.JOB_CONTEXT, {"id": job_id})
    return rows[0] if rows else None


async def workers(conn: Conn) -> list[ConsoleWorkerRow]:
    """Every registered worker with the jobs it holds."""
    return await _rows(conn, ConsoleWorkerRow, sql.WORKERS)


async def chart(
    conn: Conn, start: datetime, bucket_seconds: int, *, queue: str | None, task: str | None
) -> list[ChartRow]:
    """The rollup from `start` in buckets of `bucket_seconds`, per queue."""
    params = {"start": start, "bucket": bucket_seconds, "queue": queue, "task": task}
    return await _rows(conn, ChartRow, sql.CHART, params)


# -- written by the workers ---------------------------------------------------------------


async def roll_up(conn: Conn) -> bool:
    """Count the recent outcomes and sample the depth, unless another worker is at it."""
    async with conn.transaction():
        row = await (await conn.execute(sql.ROLLUP_TURN)).fetchone()
        if not (row and row[0]):
            return False
        await conn.execute(sql.ROLL_UP_OUTCOMES)
        await conn.execute(sql.SAMPLE_DEPTH)
        await conn.execute(sql.PRUNE_ROLLUPS)
    return True


async def publish_limits(conn: Conn, limits: Mapping[str, int]) -> None:
    """Record the retry limit each task's jobs get when they set none of their own."""
    if limits:
        await conn.execute(sql.PUBLISH_LIMITS, {"limits": Jsonb(dict(limits))})


async def publish_stages(conn: Conn, plans: StagePlans) -> None:
    """Record each pipeline's stages and cleanups, in the order they run."""
    if not plans:
        return
    body = {task: {"stages": s, "cleanups": c} for task, (s, c) in plans.items()}
    await conn.execute(sql.PUBLISH_STAGES, {"plans": Jsonb(body)})
