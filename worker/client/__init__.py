"""The client side: enqueue jobs, hold a `Job` handle, wait, cancel, resume, retry, prune.

Two clients with the same verbs: `Client` (blocking, for scripts and web handlers) and
`AsyncClient` (for asyncio services). The module-level functions (`enqueue`, `enqueue_many`,
`resume`, ...) use a default `Client` built from the settings.

    from worker import enqueue

    job = enqueue("send_email", {"to": "ada@example.com"})
    print(job.wait_sync(timeout=30))

The parts: `validation` (what a job must be), `job` (the handle), `waiting` (who is woken
when a job finishes), `_async` (the asyncio client and wait loop, written once) and `_sync`
(their blocking twin, generated from `_async`), `errors`; the clients reach the database through
`worker.db.client_async` (and its twin), which also runs a caller's transaction (`connection=`).
This module holds the public names and the default client; it does not run jobs (that is
`worker.daemon`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, overload
from uuid import UUID

from worker.client import job
from worker.client._async import AsyncClient
from worker.client._sync import Client
from worker.client.batches import MAX_BATCH_JOBS, BatchJobs, Callback
from worker.client.errors import InvalidJob, InvalidTransition, JobNotFound
from worker.client.job import Job, JobCancelledError, JobError, JobFailed
from worker.client.queues import QueueState
from worker.client.validation import (
    MAX_DELAY,
    MAX_RETRIES_LIMIT,
    RUN_AT_YEARS,
    JobSpec,
    run_at_problem,
    text_problem,
)
from worker.client.waiting import (
    LISTEN_LINGER_SECONDS,
    LISTEN_READY_SECONDS,
    LISTENER_NAME,
    WAIT_RECHECK_SECONDS,
)
from worker.db.targets import SyncTarget
from worker.ids import new_job_id, new_job_ids
from worker.models import JSON, TERMINAL_STATUSES, JobStatus

__all__ = [
    "LISTENER_NAME",
    "LISTEN_LINGER_SECONDS",
    "LISTEN_READY_SECONDS",
    "MAX_BATCH_JOBS",
    "MAX_DELAY",
    "MAX_RETRIES_LIMIT",
    "RUN_AT_YEARS",
    "WAIT_RECHECK_SECONDS",
    "AsyncClient",
    "BatchJobs",
    "Client",
    "InvalidJob",
    "InvalidTransition",
    "Job",
    "JobCancelledError",
    "JobError",
    "JobFailed",
    "JobNotFound",
    "JobSpec",
    "QueueState",
    "cancel",
    "cleanup_jobs",
    "default_client",
    "enqueue",
    "enqueue_many",
    "new_job_id",
    "new_job_ids",
    "resume",
    "retry",
    "run_at_problem",
    "text_problem",
]

_default: Client | None = None


def default_client() -> Client:
    """The process-wide `Client` for `DATABASE_URL` (the embedded server when unset)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


# A handle imports no client: it is given the blocking ones it makes on demand.
job.CLIENTS.default = default_client
job.CLIENTS.for_url = Client


def enqueue(task: str, payload: dict[str, JSON] | None = None, **options: Any) -> Job:
    """Enqueue a job with the default client; see `Client.enqueue`.

    >>> enqueue("resize_image", {"path": "a.png"}, queue="images", priority=5)  # doctest: +SKIP
    """
    return default_client().enqueue(task, payload, **options)


@overload
def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]], *, connection: SyncTarget = None
) -> list[Job]: ...


@overload
def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
    *,
    connection: SyncTarget = None,
    on_complete: Callback,
    on_failure: Callback | None = None,
) -> BatchJobs: ...


@overload
def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
    *,
    connection: SyncTarget = None,
    on_complete: Callback | None = None,
    on_failure: Callback,
) -> BatchJobs: ...


def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
    *,
    connection: SyncTarget = None,
    on_complete: Callback | None = None,
    on_failure: Callback | None = None,
) -> list[Job] | BatchJobs:
    """Enqueue many jobs in one round trip with the default client; see `Client.enqueue_many`
    (and its `on_complete` and `on_failure` callbacks).

    >>> enqueue_many([("add", {"a": i, "b": 1}) for i in range(1000)])   # doctest: +SKIP
    >>> enqueue_many(specs, on_complete="report").on_complete   # doctest: +SKIP
    """
    options: dict[str, Any] = {"on_complete": on_complete, "on_failure": on_failure}
    return default_client().enqueue_many(jobs, connection=connection, **options)


def cancel(job_id: str | UUID) -> JobStatus:
    """Cancel a job with the default client; see `Client.cancel`."""
    return default_client().cancel(job_id)


def resume(job_id: str | UUID, answer: JSON = None) -> Job:
    """Resume a paused job with the operator's answer; see `Client.resume`."""
    return default_client().resume(job_id, answer)


def retry(job_id: str | UUID) -> Job:
    """Run a failed or cancelled job again; see `Client.retry`."""
    return default_client().retry(job_id)


def cleanup_jobs(
    older_than: str | float | timedelta = "7d",
    statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
) -> int:
    """Delete finished jobs older than `older_than`; see `Client.cleanup_jobs`.

    >>> cleanup_jobs(older_than="7d")     # doctest: +SKIP
    42
    """
    return default_client().cleanup_jobs(older_than, statuses)
