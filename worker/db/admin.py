"""The operators' questions and bulk verbs, as named operations returning typed rows.

Each operation is written once, as a coroutine over a psycopg `AsyncConnection`: the HTTP edge
awaits it on a connection of its client's pool (`borrowed`), and the blocking callers (the CLI,
the metrics' scrape, the demo) run it through `blocking`, which opens one connection for the
work and closes it after.
The statements themselves live in `worker.db.sql.admin`, each with why it is safe.

What this does not do: it does not enqueue, claim or change one job (that is the client and
the daemon), and it does not decide what to print or serve.

    rows = blocking(url, "durable-worker-cli", queue_stats)          # from blocking code
    async with pool.connection() as conn: rows = await queue_stats(conn)  # from asyncio
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import class_row
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db import sql
from worker.db.connect import aconnect
from worker.models import TERMINAL_STATUSES, JobStatus

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]


def blocking(url: str, name: str, work: Callable[[Conn], Awaitable[T]], **options: Any) -> T:
    """Run `work` on a connection of its own named `name`, and wait for it.

    From a thread with an event loop running (a framework's async route calling
    `metrics.render`), the work runs on a loop of its own in another thread instead.
    """

    async def session() -> T:
        async with await aconnect(url, name, **options) as conn:
            return await work(conn)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(session())
    with ThreadPoolExecutor(1, thread_name_prefix="durable-worker-admin") as pool:
        return pool.submit(asyncio.run, session()).result()


@contextlib.asynccontextmanager
async def opened(url: str, name: str) -> AsyncIterator[Conn]:
    """A connection of its own named `name`, for a run of these operations from asyncio;
    closed after."""
    async with await aconnect(url, name) as conn:
        yield conn


@contextlib.asynccontextmanager
async def borrowed(engine: AsyncEngine) -> AsyncIterator[Conn]:
    """A connection of `engine`'s pool (a client's), for these operations: they share its
    bounds (size, timeouts, the check before reuse) rather than opening more."""
    async with engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert isinstance(raw, psycopg.AsyncConnection)
        yield raw


async def _rows(conn: Conn, cls: type[T], statement: str, params: Any = None) -> list[T]:
    async with conn.cursor(row_factory=class_row(cls)) as cur:
        await cur.execute(statement, params)
        return await cur.fetchall()


async def _count(conn: Conn, statement: str, params: Any = None) -> int:
    row = await (await conn.execute(statement, params)).fetchone()
    return int(row[0]) if row else 0


# -- the rows, typed ----------------------------------------------------------------------


class _JobStatusRow:
    """A row whose `status` is a job's: read as a `JobStatus`, not as its text."""

    status: JobStatus

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))


@dataclass(frozen=True)
class JobRow(_JobStatusRow):
    """One job as a list shows it; `error` is its first line only."""

    id: UUID
    queue: str
    task: str
    status: JobStatus
    priority: int
    retry_count: int
    error: str | None
    created_at: datetime
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class JobFilter:
    """Which jobs `find_jobs` reads: None skips a filter; ages are seconds before now."""

    status: JobStatus | None = None
    queue: str | None = None
    task: str | None = None
    older: float | None = None
    newer: float | None = None
    before_at: datetime | None = None
    before_id: str | None = None


@dataclass(frozen=True)
class FailureGroup:
    """Failed jobs of one task sharing an error type and a message with its figures masked
    (`worker.job_failures`): how many, when first and last, and the latest of them."""

    task: str
    error_type: str | None  # None: the error names no exception type (a lost worker, ...)
    message: str
    failures: int
    first_seen: datetime
    last_seen: datetime
    example_job_id: UUID


@dataclass(frozen=True)
class EventRow:
    """One progress event of a job."""

    id: int
    step: str
    status: str
    message: Any
    created_at: datetime


@dataclass(frozen=True)
class StatusCount(_JobStatusRow):
    """Jobs of one queue in one status; `oldest_pending` only for the pending ones due now."""

    queue: str
    status: JobStatus
    jobs: int
    oldest_pending: Decimal | float | None


@dataclass(frozen=True)
class QueueRow:
    """One queue as `worker.queue_stats` sees it: live jobs and the last hour."""

    queue: str
    pending: int
    scheduled: int
    processing: int
    paused: int
    failed_last_hour: int
    oldest_pending_seconds: float  # 0 when nothing due waits
    completed_last_minute: int


@dataclass(frozen=True)
class WorkerRow:
    """A registered worker, how long ago it last beat, and the ids of the jobs it holds."""

    id: UUID
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age: float
    jobs: list[str]


@dataclass(frozen=True)
class QueueCount:
    """A number of jobs in one queue."""

    queue: str
    jobs: int


@dataclass(frozen=True)
class UnservedTask:
    """Pending jobs of one task in one queue that no live worker of the queue registered
    (`worker.unserved_tasks`): they wait for a worker that has the task."""

    queue: str
    task: str
    jobs: int
    oldest_created_at: datetime
    queue_workers: int  # live workers of the queue, all serving other tasks; 0: none runs it


@dataclass(frozen=True)
class RetrySet:
    """The jobs a bulk retry moves: their filter, and the cutoff that walks them once."""

    status: JobStatus
    task: str | None
    queue: str | None
    jobs: int = 0
    cutoff: datetime | None = None

    def params(self, **more: Any) -> dict[str, Any]:
        return {"status": self.status.value, "task": self.task, "queue": self.queue, **more}


@dataclass(frozen=True)
class StatusSummary(_JobStatusRow):
    """The jobs of one status among a set: how many, their mean run time, their retries."""

    status: JobStatus
    jobs: int
    avg_seconds: Decimal | None
    retries: int


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as `worker.schedules` keeps it."""

    key: str
    last_tick: datetime
    fired: int  # jobs enqueued so far
    fired_at: datetime | None


@dataclass(frozen=True, slots=True)
class Left:
    """What a drain (`worker.testing`) still waits for."""

    due: int
    held: int

    def __str__(self) -> str:
        return f"{self.due + self.held} jobs left ({self.due} due, {self.held} running)"


@dataclass(frozen=True)
class Outcome(_JobStatusRow):
    """A job's task, status, retries, and its result (or its error's first line) as text."""

    task: str
    status: JobStatus
    retry_count: int
    outcome: str | None


# -- reading jobs -----------------------------------------------------------------------------


async def find_jobs(conn: Conn, where: JobFilter, *, limit: int, offset: int = 0) -> list[JobRow]:
    """Up to `limit` jobs, newest first, plus one more when more follow (so a caller can say)."""
    params = {
        "status": where.status.value if where.status is not None else None,
        "queue": where.queue,
        "task": where.task,
        "older": where.older,
        "newer": where.newer,
        "before_at": where.before_at,
        "before_id": where.before_id,
        "limit": limit + 1,
        "offset": offset,
    }
    return await _rows(conn, JobRow, sql.FIND_JOBS, params)


async def failure_groups(
    conn: Conn, since: float, task: str | None = None, limit: int = 50
) -> list[FailureGroup]:
    """The failures of the last `since` seconds (of `task` alone, if given), grouped, most
    frequent first: at most `limit` groups."""
    params = {"since": since, "task": task, "limit": limit}
    return await _rows(conn, FailureGroup, sql.FAILURE_GROUPS, params)


async def retry_limit(conn: Conn, job_id: str) -> int | None:
    """The retry limit that applies to the job: its own, else its task's as its workers
    published it; None if neither is known (no worker of its task has started)."""
    row = await (await conn.execute(sql.RETRY_LIMIT, {"id": job_id})).fetchone()
    return None if row is None or row[0] is None else int(row[0])


async def job_status(conn: Conn, job_id: str) -> JobStatus | None:
    """The job's status, or None when there is no such job."""
    row = await (await conn.execute(sql.JOB_STATUS, {"id": job_id})).fetchone()
    return None if row is None else JobStatus(row[0])


async def ids_beginning(conn: Conn, digits: str, limit: int) -> list[str]:
    """Up to `limit` ids (canonical text, in order) that begin with these hex digits."""
    lower, upper = (UUID(digits.ljust(32, pad)) for pad in "0f")
    params = {"lower": lower, "upper": upper, "limit": limit}
    return [row[0] for row in await (await conn.execute(sql.JOBS_BY_ID_PREFIX, params)).fetchall()]


async def ids_ending(conn: Conn, digits: str, limit: int) -> list[str]:
    """Up to `limit` ids (canonical text, in order) that end with these hex digits: this reads
    the whole table (see `sql.JOBS_BY_ID_SUFFIX`)."""
    params = {"pattern": "%" + digits, "limit": limit}
    return [row[0] for row in await (await conn.execute(sql.JOBS_BY_ID_SUFFIX, params)).fetchall()]


async def last_events(conn: Conn, job_id: str, limit: int) -> list[EventRow]:
    """The job's newest `limit` events, oldest first."""
    rows = await _rows(conn, EventRow, sql.LAST_EVENTS, {"job_id": job_id, "limit": limit})
    rows.reverse()
    return rows


# -- the queue's state ------------------------------------------------------------------------


async def health(conn: Conn) -> bool:
    """Whether the database answers and holds the worker schema."""
    row = await (await conn.execute(sql.HEALTH)).fetchone()
    return bool(row and row[0])


async def schema_revision(conn: Conn) -> str | None:
    """The migration the schema is at (None: not migrated at all)."""
    if not await _count(conn, sql.HAS_VERSION_TABLE):
        return None
    row = await (await conn.execute(sql.SCHEMA_REVISION)).fetchone()
    return None if row is None else str(row[0])


async def job_stats(conn: Conn) -> list[StatusCount]:
    """Counts per queue and status, over every job the table holds."""
    return await _rows(conn, StatusCount, sql.JOB_STATS)


async def queue_stats(conn: Conn) -> list[QueueRow]:
    """Per queue: its live jobs and its last hour."""
    return await _rows(conn, QueueRow, sql.QUEUE_STATS)


async def list_workers(conn: Conn) -> list[WorkerRow]:
    """Every registered worker, oldest first."""
    return await _rows(conn, WorkerRow, sql.LIST_WORKERS)


async def stuck_by_queue(conn: Conn, lease_seconds: float) -> list[QueueCount]:
    """Processing jobs whose worker missed its heartbeat by more than the lease, per queue."""
    async with conn.transaction():  # the lease is set for this transaction alone
        await conn.execute(sql.SET_LEASE, {"lease": lease_seconds})
        rows = await (await conn.execute(sql.STUCK_BY_QUEUE)).fetchall()
    return [QueueCount(queue, int(jobs)) for queue, jobs in rows]


async def count_live_workers(conn: Conn, lease_seconds: float) -> int:
    """Workers whose heartbeat is within the lease."""
    return await _count(conn, sql.COUNT_LIVE_WORKERS, {"lease": lease_seconds})


async def unserved_tasks(conn: Conn) -> list[UnservedTask]:
    """The pending jobs no live worker of their queue serves, per queue and task, most first."""
    return await _rows(conn, UnservedTask, sql.UNSERVED_TASKS)


# -- bulk verbs -------------------------------------------------------------------------------


async def count_retryable(conn: Conn, wanted: RetrySet) -> RetrySet:
    """How many jobs match, and the moment a retry of them starts from."""
    row = await (await conn.execute(sql.COUNT_RETRYABLE, wanted.params())).fetchone()
    assert row is not None  # an aggregate always answers
    count, since = row
    return RetrySet(wanted.status, wanted.task, wanted.queue, int(count), since)


async def retry_batch(conn: Conn, retrying: RetrySet, batch: int) -> list[QueueCount]:
    """Move up to `batch` of the set back to pending; how many per queue (none: done)."""
    params = retrying.params(cutoff=retrying.cutoff, batch=batch)
    rows = await (await conn.execute(sql.RETRY_BATCH, params)).fetchall()
    return [QueueCount(queue, int(moved)) for queue, moved, _ in rows]


def _prune_params(before: datetime, batch: int = 0) -> dict[str, Any]:
    statuses = sorted(s.value for s in TERMINAL_STATUSES)
    return {"statuses": statuses, "before": before, "batch": batch}


async def count_prunable(conn: Conn, before: datetime) -> dict[JobStatus, int]:
    """How many finished jobs finished before `before`, per status (none: no entry)."""
    rows = await (await conn.execute(sql.COUNT_PRUNABLE, _prune_params(before))).fetchall()
    return {JobStatus(status): int(jobs) for status, jobs in rows}


async def prune_batch(conn: Conn, before: datetime, batch: int) -> int:
    """Delete up to `batch` of them (their stages and events go with them); how many."""
    return (await conn.execute(sql.PRUNE_BATCH, _prune_params(before, batch))).rowcount


# -- the demo and the bench -------------------------------------------------------------------


async def count_finished(conn: Conn, ids: Sequence[str]) -> int:
    """How many of these jobs are finished."""
    statuses = sorted(TERMINAL_STATUSES)
    return await _count(conn, sql.COUNT_FINISHED, {"ids": list(ids), "statuses": statuses})


async def summary_by_status(conn: Conn, ids: Sequence[str]) -> list[StatusSummary]:
    """These jobs by status."""
    return await _rows(conn, StatusSummary, sql.SUMMARY_BY_STATUS, {"ids": list(ids)})


async def outcomes(conn: Conn, ids: Sequence[str], *, except_task: str) -> list[Outcome]:
    """What became of these jobs, but for those of one task, by task."""
    params = {"ids": list(ids), "except_task": except_task}
    return await _rows(conn, Outcome, sql.OUTCOMES, params)


async def count_unfinished_in(conn: Conn, queue: str) -> int:
    """Jobs of `queue` not completed yet."""
    return await _count(conn, sql.COUNT_UNCOMPLETED, {"queue": queue})


async def delete_queue(conn: Conn, queue: str) -> int:
    """Delete every job of `queue` (their stages and events go with them); how many."""
    return (await conn.execute(sql.DELETE_QUEUE, {"queue": queue})).rowcount


async def schedule_rows(conn: Conn, keys: list[str]) -> list[ScheduleRow]:
    """The rows of these schedules' keys (a schedule that never fired has none)."""
    return await _rows(conn, ScheduleRow, sql.SCHEDULE_ROWS, {"keys": keys})


async def left_to_run(conn: Conn, queues: list[str], tasks: list[str], worker_id: UUID) -> Left:
    """The jobs of these queues and tasks still due, and those `worker_id` holds."""
    params = {"queues": queues, "tasks": tasks, "worker_id": worker_id}
    (row,) = await _rows(conn, Left, sql.LEFT_TO_RUN, params)  # an aggregate: always one row
    return row
