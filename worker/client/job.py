"""The `Job` handle: one job's state as last read, and what you can do with it from anywhere;
and `JobError`, what waiting on a job that ended `failed` or `cancelled` raises.

A handle comes from an enqueue, from `Job.get(job_id)` or from a client's `get`; it is valid
in any process. It reads through the client that made it (a `Reader` or an `AsyncReader`, or
the default client), and waits through the wait loop of `worker.client.wait_async` (or its
generated blocking twin). It imports no client: the clients import it, and `worker.client`
gives it the blocking clients it makes on demand (`CLIENTS`). It holds no connection itself.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeGuard, cast
from uuid import UUID

from worker.client import wait_async, wait_sync
from worker.client.errors import JobNotFound
from worker.client.validation import JobSpec
from worker.client.waiting import deadline_of
from worker.models import JSON, JobStatus, StageStatus


class Reader(Protocol):
    """What a handle reads and cancels through: a blocking client (`Client`)."""

    url: str

    def get(self, job_id: str | UUID) -> Job: ...

    def cancel(self, job_id: str | UUID) -> JobStatus: ...


class AsyncReader(Protocol):
    """What a handle reads through by awaiting: an asyncio client (`AsyncClient`)."""

    url: str

    async def get(self, job_id: str | UUID) -> Job: ...


@dataclass
class Clients:
    """The blocking clients a handle uses when its own cannot serve: the default one, and one
    for the database of an asyncio client. `worker.client`, which makes the clients, sets
    both when it is imported, before any handle exists."""

    default: Callable[[], Reader] | None = None
    for_url: Callable[[str], Reader] | None = None


CLIENTS = Clients()


def _awaited(client: Reader | AsyncReader) -> TypeGuard[AsyncReader]:
    """Whether `client` reads by awaiting (an asyncio client)."""
    return inspect.iscoroutinefunction(client.get)


def _default() -> Reader:
    assert CLIENTS.default is not None, "worker.client sets it when imported"
    return CLIENTS.default()


class JobError(RuntimeError):
    """A job you waited on ended `failed` or `cancelled`.

    `.job` is the job's final state and `.error` its error (the task's exception and
    traceback, or why it was cancelled).

    >>> try:                                    # doctest: +SKIP
    ...     job.wait_sync()
    ... except JobError as exc:
    ...     print(exc.job.status, exc.error)
    """

    def __init__(self, job: Job) -> None:
        detail = f": {job.error}" if job.error else ""
        super().__init__(f"job {job.job_id} ({job.task}) {job.status}{detail}")
        self.job = job
        self.error = job.error


class JobFailed(JobError):
    """The job ran out of retries (or could not run at all, e.g. its payload is unreadable)."""


class JobCancelledError(JobError):
    """The job was cancelled."""


@dataclass
class Job:
    """A handle on one job, valid in any process: from `enqueue(...)` or `Job.get(job_id)`.

    >>> job = Job.get("0b0e3c5e-6f0a-4c8e-9d55-0c1f2b7a9e11")   # doctest: +SKIP
    >>> job.refresh().status                                      # doctest: +SKIP
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
    unique_key: str | None = None
    concurrency_key: str | None = None
    stages: list[dict[str, JSON]] = field(default_factory=list)
    # The enqueue that made this handle found a live job with its unique key: this is that job.
    duplicate: bool = False
    client: Reader | AsyncReader | None = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.job_id

    @property
    def outputs(self) -> dict[str, JSON]:
        """Stage outputs by stage name (completed stages only)."""
        return {
            s["stage"]: s["output"] for s in self.stages if s["status"] == StageStatus.COMPLETED
        }

    @classmethod
    def get(cls, job_id: str | UUID) -> Job:
        """Read a job by id with the default client (`DATABASE_URL`), in any process.

        >>> Job.get(job_id).wait_sync(timeout=60)     # doctest: +SKIP
        """
        return _default().get(job_id)

    def _client(self) -> Reader:
        if self.client is None:
            return _default()
        if _awaited(self.client):
            assert CLIENTS.for_url is not None, "worker.client sets it when imported"
            return CLIENTS.for_url(self.client.url)
        return cast(Reader, self.client)  # not awaited: a blocking client

    def update(self, other: Job) -> Job:
        """Take every field of `other` but its client (and what its enqueue found); returns the
        handle itself."""
        for name in self.__dataclass_fields__:
            if name not in ("client", "duplicate"):
                setattr(self, name, getattr(other, name))
        return self

    def refresh(self) -> Job:
        """Re-read the job from the database (blocking); returns the handle itself."""
        return self.update(self._client().get(self.job_id))

    def outcome(self) -> JSON:
        """The result of a completed job; `JobFailed` or `JobCancelledError` if it ended so;
        the result as it stands (None) for a job not finished."""
        if self.status == JobStatus.COMPLETED:
            return self.result
        if self.status == JobStatus.FAILED:
            raise JobFailed(self)
        if self.status == JobStatus.CANCELLED:
            raise JobCancelledError(self)
        return self.result  # timed out: still pending, processing or paused

    def wait_sync(self, timeout: float | None = None) -> JSON:
        """Block until the job finishes; return its result.

        Raises `JobFailed` or `JobCancelledError` (both `RuntimeError`, carrying the job's
        error) if it ended so. On timeout, returns without raising and the handle shows the
        current status: check `job.status`. A paused job is waited on until it is resumed
        and finishes (or the timeout passes).

        >>> job = enqueue("add", {"a": 1, "b": 2})    # doctest: +SKIP
        >>> job.wait_sync(timeout=30)                 # doctest: +SKIP
        3
        """
        deadline = deadline_of(timeout)
        client = self._client()
        return wait_sync.wait_done(self, client.get, client.url, deadline)

    async def wait(self, timeout: float | None = None) -> JSON:
        """The async `wait_sync`: suspends the coroutine instead of blocking the thread.

        >>> result = await job.wait(timeout=30)       # doctest: +SKIP
        """
        deadline = deadline_of(timeout)
        if self.client is not None and _awaited(self.client):
            return await wait_async.wait_done(self, self.client.get, self.client.url, deadline)
        url = self.client.url if self.client is not None else _default().url

        async def get(job_id: str) -> Job:  # a blocking client reads in a thread
            return await asyncio.to_thread(self._client().get, job_id)

        return await wait_async.wait_done(self, get, url, deadline)

    def cancel(self) -> JobStatus:
        """Request cancellation; returns the status right after the request.

        A job that has not started is cancelled at once; a running one stops at its next
        stage boundary (or when its task checks `ctx.cancelled`), running its cleanup first.
        """
        status = self._client().cancel(self.job_id)
        self.status = status
        return status


def job_from_row(row: Any, stages: Sequence[Any], client: Reader | AsyncReader) -> Job:
    """A handle from a row of `sql.GET_JOB` and the job's rows of `sql.GET_STAGES`."""
    return Job(
        job_id=str(row.id),
        task=row.task,
        status=JobStatus(row.status),
        queue=row.queue,
        payload=row.payload,
        result=row.result,
        error=row.error,
        retry_count=row.retry_count,
        max_retries=row.max_retries,
        priority=row.priority,
        question=row.question,
        answer=row.answer,
        cancel_requested=row.cancel_requested,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        run_at=row.run_at,
        unique_key=row.unique_key,
        concurrency_key=row.concurrency_key,
        # Each stage as a dict of its columns: stage, kind, status, output, error, attempt,
        # started_at, finished_at.
        stages=[dict(s._mapping) for s in stages],
        client=client,
    )


def new_job(
    job_id: object,
    spec: JobSpec,
    client: Reader | AsyncReader,
    run_at: datetime | None = None,
    duplicate: bool = False,
) -> Job:
    """The handle of a job just enqueued from `spec` (or, `duplicate`, of the live job that
    held its unique key)."""
    return Job(
        job_id=str(job_id),
        duplicate=duplicate,
        task=spec.task,
        queue=spec.queue,
        payload=spec.payload,
        priority=spec.priority,
        max_retries=spec.max_retries,
        run_at=run_at,
        unique_key=spec.unique_key,
        concurrency_key=spec.concurrency_key,
        client=client,
    )


def retry_refused(job: Job) -> str:
    """Why `sql.RETRY` left the job as it was: its status, or its unique key held by another."""
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        return (
            f"job {job.job_id} cannot run again while another live job holds its unique key "
            f"{job.unique_key!r}"
        )
    return f"job {job.job_id} is {job.status}: only failed or cancelled jobs can be retried"


def cancel_result(job_id: str, row: Any) -> JobStatus:
    """The status after a cancel request, from the row of `sql.CANCEL`."""
    if row is None or row.before is None:
        raise JobNotFound(f"no job {job_id}")
    if row.after is None:
        return JobStatus(row.before)  # already finished: nothing to cancel
    return JobStatus(row.after)
