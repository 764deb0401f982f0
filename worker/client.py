"""The client side: enqueue jobs, hold a `Job` handle, wait, cancel, resume, retry, prune.

Two clients with the same verbs: `Client` (blocking, for scripts and web handlers) and
`AsyncClient` (for asyncio services). The module-level functions (`enqueue`, `enqueue_many`,
`resume`, ...) use a default `Client` built from the settings.

    from worker import enqueue

    job = enqueue("send_email", {"to": "ada@example.com"})
    print(job.wait_sync(timeout=30))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from worker.db import sql
from worker.db.engine import async_engine, database_url, sync_engine
from worker.models import TERMINAL_STATUSES, JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE
from worker.settings import get_settings

JSON = Any
# How often a waiter re-reads the job even without a notification (a missed NOTIFY, a
# reconnect): the notification is the fast path, this is the safety net.
WAIT_RECHECK_SECONDS = 2.0


class JobError(RuntimeError):
    """A job you waited on ended `failed` or `cancelled`; `.job` holds its final state."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.job_id} ({job.task}) {job.status}: {job.error or ''}".strip())
        self.job = job


class JobFailed(JobError):
    """The job ran out of retries."""


class JobCancelledError(JobError):
    """The job was cancelled."""


class InvalidJob(ValueError):
    """A job was refused before anything was written: the message names the problem."""


class JobNotFound(LookupError):
    pass


class InvalidTransition(RuntimeError):
    """The job is not in a status that allows the action (e.g. resuming a job not paused)."""


@dataclass
class JobSpec:
    """One job to enqueue (used by `enqueue_many`)."""

    task: str
    payload: dict[str, JSON] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    delay: float | timedelta = 0.0
    run_at: datetime | None = None
    max_retries: int | None = None


def _validated(spec: JobSpec, max_bytes: int) -> dict[str, Any]:
    if not isinstance(spec.task, str) or not 1 <= len(spec.task) <= MAX_TASK_NAME:
        raise InvalidJob(f"task name must be a string of 1 to {MAX_TASK_NAME} characters")
    if not isinstance(spec.payload, dict):
        raise InvalidJob(
            f"payload must be a JSON object (a dict), not {type(spec.payload).__name__}"
        )
    try:
        text = json.dumps(spec.payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidJob("payload is nested too deeply to be stored as JSON") from None
    if "\\u0000" in text:
        raise InvalidJob("payload contains a NUL character, which PostgreSQL cannot store")
    if len(text.encode()) > max_bytes:
        raise InvalidJob(
            f"payload is {len(text.encode())} bytes; the limit is {max_bytes} "
            "(WORKER_MAX_PAYLOAD_BYTES): store large data elsewhere and pass a reference"
        )
    if not isinstance(spec.queue, str) or not 1 <= len(spec.queue) <= 255:
        raise InvalidJob("queue name must be a string of 1 to 255 characters")
    low, high = PRIORITY_RANGE
    if not isinstance(spec.priority, int) or not low <= spec.priority <= high:
        raise InvalidJob(f"priority must be an integer from {low} to {high}")
    if spec.max_retries is not None and (
        not isinstance(spec.max_retries, int) or spec.max_retries < 0
    ):
        raise InvalidJob("max_retries must be a non-negative integer")
    delay = spec.delay.total_seconds() if isinstance(spec.delay, timedelta) else spec.delay
    if spec.run_at is not None and spec.run_at.tzinfo is None:
        raise InvalidJob("run_at must be timezone-aware (e.g. datetime.now(UTC))")
    return {
        "task": spec.task,
        "payload": text,
        "queue": spec.queue,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": float(delay),
        "max_retries": spec.max_retries,
    }


def _many_params(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = {
        "task": "tasks",
        "payload": "payloads",
        "queue": "queues",
        "priority": "priorities",
        "run_at": "run_ats",
        "delay": "delays",
        "max_retries": "max_retries",
    }
    return {plural: [r[key] for r in rows] for key, plural in keys.items()}


@dataclass
class Job:
    """A handle on one job, valid in any process.

    >>> job = Job.get("0b0e…")            # doctest: +SKIP
    >>> job.refresh().status               # doctest: +SKIP
    <JobStatus.COMPLETED: 'completed'>
    """

    job_id: str
    task: str = ""
    status: JobStatus = JobStatus.PENDING
    queue: str = "default"
    payload: dict[str, JSON] = field(default_factory=dict)
    result: JSON = None
    error: str | None = None
    retry_count: int = 0
    max_retries: int | None = None
    priority: int = 0
    question: JSON = None
    answer: JSON = None
    cancel_requested: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime | None = None
    stages: list[dict[str, JSON]] = field(default_factory=list)
    client: Client | AsyncClient | None = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.job_id

    @property
    def outputs(self) -> dict[str, JSON]:
        """Stage outputs by stage name (completed stages only)."""
        return {s["stage"]: s["output"] for s in self.stages if s["status"] == "completed"}

    @classmethod
    def get(cls, job_id: str | UUID) -> Job:
        return default_client().get(job_id)

    def _client(self) -> Client:
        if isinstance(self.client, Client):
            return self.client
        return default_client()

    def _async_client(self) -> AsyncClient:
        if isinstance(self.client, AsyncClient):
            return self.client
        return AsyncClient(default_client().url)

    def _update(self, other: Job) -> Job:
        for name in self.__dataclass_fields__:
            if name != "client":
                setattr(self, name, getattr(other, name))
        return self

    def refresh(self) -> Job:
        """Re-read the job from the database."""
        return self._update(self._client().get(self.job_id))

    def _outcome(self) -> JSON:
        if self.status == JobStatus.COMPLETED:
            return self.result
        if self.status == JobStatus.FAILED:
            raise JobFailed(self)
        if self.status == JobStatus.CANCELLED:
            raise JobCancelledError(self)
        return self.result  # timed out: still running, paused or pending

    def wait_sync(self, timeout: float | None = None) -> JSON:
        """Block until the job completes and return its result.

        Raises `JobFailed` / `JobCancelledError` (both `RuntimeError`) if it ended so. On
        timeout, returns without raising: check `job.status` to tell. Woken by NOTIFY.
        """
        client = self._client()
        deadline = None if timeout is None else time.monotonic() + timeout
        with psycopg.connect(client.url, autocommit=True) as conn:
            conn.execute("LISTEN worker_done")
            while True:
                self.refresh()
                if self.status.is_terminal:
                    return self._outcome()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return self._outcome()
                wait = WAIT_RECHECK_SECONDS if left is None else min(left, WAIT_RECHECK_SECONDS)
                for note in conn.notifies(timeout=wait):
                    if note.payload == self.job_id:
                        break

    async def wait(self, timeout: float | None = None) -> JSON:
        """The async `wait_sync`: suspends the coroutine instead of blocking the thread."""
        client = self._async_client()
        deadline = None if timeout is None else time.monotonic() + timeout
        async with await psycopg.AsyncConnection.connect(client.url, autocommit=True) as conn:
            await conn.execute("LISTEN worker_done")
            while True:
                self._update(await client.get(self.job_id))
                if self.status.is_terminal:
                    return self._outcome()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return self._outcome()
                wait = WAIT_RECHECK_SECONDS if left is None else min(left, WAIT_RECHECK_SECONDS)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_until_note(conn, self.job_id), wait)

    def cancel(self) -> JobStatus:
        """Request cancellation (cooperative); returns the status right after the request."""
        return self._client().cancel(self.job_id)


async def _until_note(conn: psycopg.AsyncConnection[Any], job_id: str) -> None:
    async for note in conn.notifies():
        if note.payload == job_id:
            return


def _job_from_row(row: Any, stages: Sequence[Any], client: Client | AsyncClient) -> Job:
    (
        job_id,
        queue,
        task,
        payload,
        status,
        priority,
        run_at,
        retry_count,
        max_retries,
        result,
        error,
        created_at,
        started_at,
        finished_at,
        _worker,
        cancel_requested,
        question,
        answer,
    ) = row
    return Job(
        job_id=str(job_id),
        task=task,
        status=JobStatus(status),
        queue=queue,
        payload=payload,
        result=result,
        error=error,
        retry_count=retry_count,
        max_retries=max_retries,
        priority=priority,
        question=question,
        answer=answer,
        cancel_requested=cancel_requested,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        run_at=run_at,
        stages=[
            {
                "stage": s[0],
                "kind": s[1],
                "status": s[2],
                "output": s[3],
                "error": s[4],
                "attempt": s[5],
                "started_at": s[6],
                "finished_at": s[7],
            }
            for s in stages
        ],
        client=client,
    )


def _cancel_result(job_id: str, row: Any) -> JobStatus:
    if row is None or row[0] is None:
        raise JobNotFound(f"no job {job_id}")
    before, after = row[0], row[1]
    if after is None:
        return JobStatus(before)  # already finished: nothing to cancel
    return JobStatus(after)


def _parse_duration(value: str | float | timedelta) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = value.strip().lower()
    if text and text[-1] in units:
        return timedelta(seconds=float(text[:-1]) * units[text[-1]])
    return timedelta(seconds=float(text))


SyncTarget = Connection | Session | None
AsyncTarget = AsyncConnection | AsyncSession | None


class Client:
    """Blocking client. `connection=` joins the caller's transaction (SQLAlchemy `Connection`
    or `Session`): the job then exists if and only if that transaction commits.

    >>> client = Client()                                       # doctest: +SKIP
    >>> with engine.begin() as conn:                            # doctest: +SKIP
    ...     conn.execute(orders.insert().values(id=42))
    ...     client.enqueue("ship_order", {"order": 42}, connection=conn)
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = url or database_url()
        self.engine: Engine = sync_engine(self.url)
        self.max_payload_bytes = get_settings().max_payload_bytes

    def _execute(self, statement: str, params: dict[str, Any], connection: SyncTarget) -> Any:
        if connection is None:
            with self.engine.begin() as conn:
                return conn.exec_driver_sql(statement, params).fetchall()
        conn = connection.connection() if isinstance(connection, Session) else connection
        return conn.exec_driver_sql(statement, params).fetchall()

    def enqueue(
        self,
        task: str,
        payload: dict[str, JSON] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float | timedelta = 0.0,
        run_at: datetime | None = None,
        max_retries: int | None = None,
        connection: SyncTarget = None,
    ) -> Job:
        params = _validated(
            JobSpec(
                task,
                {} if payload is None else payload,
                queue,
                priority,
                delay,
                run_at,
                max_retries,
            ),
            self.max_payload_bytes,
        )
        (row,) = self._execute(sql.ENQUEUE, params, connection)
        return Job(
            job_id=str(row[0]),
            task=task,
            queue=queue,
            payload=payload or {},
            priority=priority,
            max_retries=max_retries,
            client=self,
        )

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
    ) -> list[Job]:
        """Insert many jobs in one statement; all are validated first, none written if one
        is bad. Idle workers are woken once."""
        specs = [j if isinstance(j, JobSpec) else JobSpec(*j) for j in jobs]
        rows = []
        for i, spec in enumerate(specs):
            try:
                rows.append(_validated(spec, self.max_payload_bytes))
            except InvalidJob as exc:
                raise InvalidJob(f"job {i}: {exc}") from None
        if not rows:
            return []
        ids = self._execute(sql.ENQUEUE_MANY, _many_params(rows), connection)
        return [
            Job(job_id=str(r[0]), task=s.task, queue=s.queue, payload=s.payload, client=self)
            for r, s in zip(ids, specs, strict=True)
        ]

    def get(self, job_id: str | UUID) -> Job:
        with self.engine.connect() as conn:
            row = conn.exec_driver_sql(sql.GET_JOB, {"id": str(job_id)}).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id}")
            stages = conn.exec_driver_sql(sql.GET_STAGES, {"id": str(job_id)}).fetchall()
        return _job_from_row(row, stages, self)

    def cancel(self, job_id: str | UUID) -> JobStatus:
        """Cancel a job: at once if it has not started, else at its next stage boundary.
        Returns the status after the request (a finished job's status is returned as is)."""
        (row,) = self._execute(sql.CANCEL, {"id": str(job_id)}, None)
        return _cancel_result(str(job_id), row)

    def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        """Answer a paused job's question; it goes back to `pending`."""
        rows = self._execute(sql.RESUME, {"id": str(job_id), "answer": json.dumps(answer)}, None)
        if not rows:
            status = self.get(job_id).status
            raise InvalidTransition(f"job {job_id} is {status}, not paused: nothing to resume")
        return self.get(job_id)

    def retry(self, job_id: str | UUID) -> Job:
        """Run a failed or cancelled job again, with fresh retries."""
        if not self._execute(sql.RETRY, {"id": str(job_id)}, None):
            status = self.get(job_id).status
            raise InvalidTransition(
                f"job {job_id} is {status}: only failed or cancelled jobs can be retried"
            )
        return self.get(job_id)

    def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs (with their stages and events) in short batches; returns how
        many were removed."""
        params = {
            "statuses": [str(JobStatus(s)) for s in statuses],
            "before": datetime.now().astimezone() - _parse_duration(older_than),
            "batch": batch_size,
        }
        bad = [s for s in params["statuses"] if s not in TERMINAL_STATUSES]
        if bad:
            raise ValueError(f"only finished jobs can be removed, not {', '.join(bad)}")
        removed = 0
        while True:
            with self.engine.begin() as conn:
                n = conn.exec_driver_sql(sql.PRUNE_BATCH, params).rowcount
            removed += n
            if n < batch_size:
                return removed


class AsyncClient:
    """The asyncio twin of `Client`, with the same verbs."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or database_url()
        self.engine: AsyncEngine = async_engine(self.url)
        self.max_payload_bytes = get_settings().max_payload_bytes

    async def _execute(
        self, statement: str, params: dict[str, Any], connection: AsyncTarget
    ) -> Any:
        if connection is None:
            async with self.engine.begin() as conn:
                return (await conn.exec_driver_sql(statement, params)).fetchall()
        if isinstance(connection, AsyncSession):
            conn = await connection.connection()
        else:
            conn = connection
        return (await conn.exec_driver_sql(statement, params)).fetchall()

    async def enqueue(
        self,
        task: str,
        payload: dict[str, JSON] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float | timedelta = 0.0,
        run_at: datetime | None = None,
        max_retries: int | None = None,
        connection: AsyncTarget = None,
    ) -> Job:
        params = _validated(
            JobSpec(
                task,
                {} if payload is None else payload,
                queue,
                priority,
                delay,
                run_at,
                max_retries,
            ),
            self.max_payload_bytes,
        )
        (row,) = await self._execute(sql.ENQUEUE, params, connection)
        return Job(
            job_id=str(row[0]),
            task=task,
            queue=queue,
            payload=payload or {},
            priority=priority,
            max_retries=max_retries,
            client=self,
        )

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
    ) -> list[Job]:
        specs = [j if isinstance(j, JobSpec) else JobSpec(*j) for j in jobs]
        rows = []
        for i, spec in enumerate(specs):
            try:
                rows.append(_validated(spec, self.max_payload_bytes))
            except InvalidJob as exc:
                raise InvalidJob(f"job {i}: {exc}") from None
        if not rows:
            return []
        ids = await self._execute(sql.ENQUEUE_MANY, _many_params(rows), connection)
        return [
            Job(job_id=str(r[0]), task=s.task, queue=s.queue, payload=s.payload, client=self)
            for r, s in zip(ids, specs, strict=True)
        ]

    async def get(self, job_id: str | UUID) -> Job:
        async with self.engine.connect() as conn:
            row = (await conn.exec_driver_sql(sql.GET_JOB, {"id": str(job_id)})).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id}")
            stages = (await conn.exec_driver_sql(sql.GET_STAGES, {"id": str(job_id)})).fetchall()
        return _job_from_row(row, stages, self)

    async def cancel(self, job_id: str | UUID) -> JobStatus:
        (row,) = await self._execute(sql.CANCEL, {"id": str(job_id)}, None)
        return _cancel_result(str(job_id), row)

    async def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        rows = await self._execute(
            sql.RESUME, {"id": str(job_id), "answer": json.dumps(answer)}, None
        )
        if not rows:
            status = (await self.get(job_id)).status
            raise InvalidTransition(f"job {job_id} is {status}, not paused: nothing to resume")
        return await self.get(job_id)

    async def retry(self, job_id: str | UUID) -> Job:
        if not await self._execute(sql.RETRY, {"id": str(job_id)}, None):
            status = (await self.get(job_id)).status
            raise InvalidTransition(
                f"job {job_id} is {status}: only failed or cancelled jobs can be retried"
            )
        return await self.get(job_id)

    async def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        client = Client(self.url)
        return await asyncio.to_thread(client.cleanup_jobs, older_than, statuses, batch_size)


_default: Client | None = None


def default_client() -> Client:
    global _default
    if _default is None:
        _default = Client()
    return _default


def enqueue(task: str, payload: dict[str, JSON] | None = None, **options: Any) -> Job:
    """Enqueue a job with the default client; see `Client.enqueue`.

    >>> job = enqueue("resize_image", {"path": "a.png"}, queue="images", priority=5)  # doctest: +SKIP
    """
    return default_client().enqueue(task, payload, **options)


def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]], **options: Any
) -> list[Job]:
    """Enqueue many jobs in one round trip with the default client."""
    return default_client().enqueue_many(jobs, **options)


def cancel(job_id: str | UUID) -> JobStatus:
    return default_client().cancel(job_id)


def resume(job_id: str | UUID, answer: JSON = None) -> Job:
    """Resume a paused job with the operator's answer."""
    return default_client().resume(job_id, answer)


def retry(job_id: str | UUID) -> Job:
    return default_client().retry(job_id)


def cleanup_jobs(
    older_than: str | float | timedelta = "7d",
    statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
) -> int:
    """Delete finished jobs older than `older_than` ("7d", "12h", seconds or a timedelta)."""
    return default_client().cleanup_jobs(older_than, statuses)
