"""The client's exceptions: a job refused, not found, or not in a status for the action (those of
a job that ended `failed` or `cancelled` while you waited on it are `worker.client.job`'s).

Raised by the clients and the `Job` handle; the HTTP edge and the CLI turn them into status
codes and messages. Nothing here talks to the database.
"""

from __future__ import annotations


class InvalidJob(ValueError):
    """A job was refused before anything was written: the message names the problem."""


class JobNotFound(LookupError):
    """No job has this id (it may have been removed by retention)."""


class InvalidTransition(RuntimeError):
    """The job is not in a status that allows the action (e.g. resuming a job not paused)."""
