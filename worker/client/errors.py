"""The client's exceptions: a job refused, not found, not in a status for the action, or ended
`failed` or `cancelled` while you waited on it.

Raised by the clients and the `Job` handle; the HTTP edge and the CLI turn them into status
codes and messages. Nothing here talks to the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.client.job import Job


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


class InvalidJob(ValueError):
    """A job was refused before anything was written: the message names the problem."""


class JobNotFound(LookupError):
    """No job has this id (it may have been removed by retention)."""


class InvalidTransition(RuntimeError):
    """The job is not in a status that allows the action (e.g. resuming a job not paused)."""
