# Generated from worker/client/_async.py by scripts/unasync.py: do not edit.
"""The blocking client.

Generated from `worker.client._async`, the one implementation of both: see it for
what they do, and edit it (then run `python scripts/unasync.py`), not this file.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import cache
from typing import overload
from uuid import UUID

from worker import tracing
from worker.client.batches import BATCH_WORKFLOW, BatchJobs, Callback, with_callbacks
from worker.client.errors import InvalidTransition, JobNotFound
from worker.client.job import (
    Job,
    cancel_result,
    job_from_row,
    new_job,
    retry_refused,
)
from worker.client.queues import QueueState, limit_params, queue_name
from worker.client.validation import (
    UNIQUE_TRIES,
    Batch,
    JobSpec,
    job_id_of,
    prepared_many,
    prune_params,
    stored_json,
    traced,
    unsettled_key,
    validated,
)
from worker.client.workflows import WorkflowHandle
from worker.db import sql
from worker.db.client_sync import Database
from worker.db.embedded import database_url
from worker.db.targets import SyncTarget
from worker.ids import new_job_id
from worker.models import JSON, TERMINAL_STATUSES, JobStatus
from worker.settings import get_settings
from worker.urls import psycopg_url


class Client:
    """The blocking client: enqueue jobs, read them, cancel, resume, retry and prune them.

    `connection=` joins the caller's transaction (a SQLAlchemy `Connection` or
    `Session`, on the psycopg or asyncpg driver, or a psycopg `Connection`): the
    job then exists if and only if that transaction commits, and no worker sees it before.

    >>> client = Client()                                          # doctest: +SKIP
    >>> with engine.begin() as conn:                              # doctest: +SKIP
    ...     conn.execute(orders.insert().values(id=42))
    ...     client.enqueue("ship_order", {"order": 42}, connection=conn)
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = psycopg_url(url) if url else database_url()
        self._db = Database(self.url)
        self.engine = self._db.engine
        self.max_payload_bytes = get_settings().max_payload_bytes

    def close(self) -> None:
        """Close the client's idle connections (it opens new ones if used again).

        >>> client.close()                                    # doctest: +SKIP
        """
        self._db.close()

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
        unique_key: str | None = None,
        concurrency_key: str | None = None,
        connection: SyncTarget = None,
    ) -> Job:
        """Enqueue one job; returns its handle. Refused with `InvalidJob` before anything is
        written if the payload is not a JSON object or an option is out of range.

        With `unique_key`, while a pending, processing or paused job holds that key, nothing
        is inserted: the handle is that job's, with `duplicate` true. Jobs sharing a
        `concurrency_key` run at most their task's `concurrency` at once (1 by default).

        >>> client.enqueue("send_email", {"to": "ada@example.com"})  # doctest: +SKIP
        >>> client.enqueue("bill", {"id": 42}, unique_key="bill:42")  # doctest: +SKIP
        """
        spec = JobSpec(
            task,
            {} if payload is None else payload,
            queue,
            priority,
            delay,
            run_at,
            max_retries,
            unique_key,
            concurrency_key,
        )
        params = validated(spec, self.max_payload_bytes)
        params["id"] = new_job_id()
        params["trace_context"] = tracing.carrier()
        if unique_key is None:
            statement, again = sql.ENQUEUE, sql.ENQUEUE_AGAIN
            ((id_, due),) = self._db.insert(statement, again, params, connection, True)
            return new_job(id_, spec, self, due)
        for _ in range(UNIQUE_TRIES):
            statement = sql.ENQUEUE_UNIQUE  # safe to run again, as it is
            found = self._db.insert(statement, statement, params, connection, True)
            if found:
                ((id_, due),) = found
                return new_job(id_, spec, self, due, duplicate=str(id_) != params["id"])
        raise unsettled_key(unique_key)

    @overload
    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
    ) -> list[Job]: ...

    @overload
    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
        on_complete: Callback,
        on_failure: Callback | None = None,
    ) -> BatchJobs: ...

    @overload
    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
        on_complete: Callback | None = None,
        on_failure: Callback,
    ) -> BatchJobs: ...

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
        on_complete: Callback | None = None,
        on_failure: Callback | None = None,
    ) -> list[Job] | BatchJobs:
        """Insert many jobs in one statement (one round trip); returns their handles in order.

        Every job is validated first: if one is bad, `InvalidJob` names its index and nothing
        is written. Idle workers are woken once per queue, not once per job.

        With `on_complete` (a task, a task's name or a `JobSpec`), one job of it runs once
        every job of the batch has ended, however each ended; with `on_failure`, one runs
        then only if a job failed for good or was cancelled. Each reads the outcomes counted
        as `ctx.parent_counts`. The batch is then a workflow, written in the same one
        statement, of at most `MAX_BATCH_JOBS` jobs with no `unique_key`; the handles come as
        a `BatchJobs` list, with `on_complete`, `on_failure` and `workflow`.

        >>> client.enqueue_many([("resize", {"id": i}) for i in range(50)])  # doctest: +SKIP
        >>> client.enqueue_many(specs, on_complete="report")   # doctest: +SKIP
        """
        if on_complete is not None or on_failure is not None:
            prepared = with_callbacks(jobs, on_complete, on_failure, self.max_payload_bytes)
            statement = sql.ENQUEUE_WORKFLOW  # idempotent by the workflow's id: safe to run again
            self._db.insert(statement, statement, prepared.params, connection, True)
            made = zip(prepared.batch.ids, prepared.batch.specs, strict=True)
            every = [new_job(i, spec, self) for i, spec in made]
            named = prepared.named(every)
            workflow = WorkflowHandle(prepared.params["id"], BATCH_WORKFLOW, None, named, self)
            return prepared.handles(every, workflow)
        batch = prepared_many(jobs, self.max_payload_bytes)
        if not batch.specs:
            return []
        trace = tracing.carrier()
        if batch.unique:
            found = self._insert_unique(batch.sent(), connection, trace)
            # A job sharing its key with an earlier one of the batch gets that one's job.
            held = [found[batch.ids[batch.same_as.get(i, i)]] for i in range(len(batch.ids))]
            return [
                new_job(job_id, spec, self, duplicate=job_id != asked)
                for job_id, asked, spec in zip(held, batch.ids, batch.specs, strict=True)
            ]

        @cache  # made once: while the server writes the rows of a COPY, or else after
        def handles() -> list[Job]:
            return [new_job(i, s, self) for i, s in zip(batch.ids, batch.specs, strict=True)]

        if connection is None and batch.copyable:
            copy = sql.ENQUEUE_MANY_COPY if trace is None else sql.ENQUEUE_MANY_COPY_TRACED
            self._db.copy(
                copy,
                batch.copy_chunks(trace),
                sql.ENQUEUE_MANY_AGAIN,
                lambda: traced(batch.params(), trace),
                meanwhile=handles,
            )
        else:
            params = traced(batch.params(), trace)
            statement, again = sql.ENQUEUE_MANY, sql.ENQUEUE_MANY_AGAIN
            self._db.insert(statement, again, params, connection, False)
        return handles()

    def _insert_unique(
        self, batch: Batch, connection: SyncTarget, trace: str | None
    ) -> dict[str, str]:
        """Each job's id in the database, by the id it was sent with: its own, or that of the
        live job holding its unique key."""
        found: dict[str, str] = {}
        for _ in range(UNIQUE_TRIES):
            params = traced(batch.params(), trace)
            statement = sql.ENQUEUE_MANY_UNIQUE  # safe to run again, as it is
            rows_ = self._db.insert(statement, statement, params, connection, True)
            found.update({str(asked): str(id_) for asked, id_ in rows_ if id_ is not None})
            batch = batch.without(found)
            if not batch.ids:
                return found
        raise unsettled_key(str(batch.rows[0]["unique_key"]))

    def get(self, job_id: str | UUID) -> Job:
        """The job's current state, with its stages; `JobNotFound` if there is no such job."""
        found = self._db.read_job(sql.GET_JOB, sql.GET_STAGES, {"id": job_id_of(job_id)})
        if found is None:
            raise JobNotFound(f"no job {job_id}")
        row, stages = found
        return job_from_row(row, stages, self)

    def cancel(self, job_id: str | UUID) -> JobStatus:
        """Cancel a job: at once if it has not started, else at its next stage boundary.
        Returns the status after the request (a finished job's status is returned as is)."""
        (row,) = self._db.run(sql.CANCEL, {"id": job_id_of(job_id)})
        return cancel_result(str(job_id), row)

    def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        """Answer a paused job's question; it goes back to `pending`.

        >>> client.resume(job_id, {"approved": True})     # doctest: +SKIP
        """
        params = {
            "id": job_id_of(job_id),
            "answer": stored_json(answer, "answer", self.max_payload_bytes),
        }
        if not self._db.run(sql.RESUME, params):
            job = self.get(job_id)
            raise InvalidTransition(f"job {job_id} is {job.status}, not paused: nothing to resume")
        return self.get(job_id)

    def retry(self, job_id: str | UUID) -> Job:
        """Run a failed or cancelled job again, with fresh retries."""
        if not self._db.run(sql.RETRY, {"id": job_id_of(job_id)}):
            job = self.get(job_id)
            raise InvalidTransition(retry_refused(job))
        return self.get(job_id)

    def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs that finished longer ago than `older_than` ("7d", "12h",
        seconds or a timedelta), with their stages and events. Each batch of `batch_size` is
        its own short transaction, so no lock is held for long. Returns how many were removed.

        >>> client.cleanup_jobs(older_than="30d", statuses=["completed"])   # doctest: +SKIP
        1200
        """
        params = prune_params(older_than, statuses, batch_size)
        removed = 0
        while True:
            n: int = self._db.run(sql.PRUNE_BATCH, params)
            removed += n
            if n < batch_size:
                return removed

    # -- queues -----------------------------------------------------------------------------

    def queues(self) -> list[QueueState]:
        """Every queue with live jobs or controls: paused or not, its limits, its depth."""
        return [QueueState.of(row) for row in self._db.run(sql.QUEUE_STATES, {"name": None})]

    def queue(self, name: str) -> QueueState:
        """One queue's state (an unknown queue is running, unlimited and empty)."""
        params = {"name": queue_name(name)}
        found = [QueueState.of(row) for row in self._db.run(sql.QUEUE_STATES, params)]
        return found[0] if found else QueueState(name, False, None, None, None, 0, 0)

    def pause_queue(self, name: str) -> QueueState:
        """Stop every worker claiming from the queue, from its next claim on; running jobs
        finish. A job whose cancel was requested still settles.

        >>> client.pause_queue("emails")                      # doctest: +SKIP
        """
        self._db.run(sql.PAUSE_QUEUE, {"name": queue_name(name)})
        return self.queue(name)

    def resume_queue(self, name: str) -> QueueState:
        """Let workers claim from the queue again, waking the idle ones at once."""
        self._db.run(sql.RESUME_QUEUE, {"name": queue_name(name)})
        return self.queue(name)

    def limit_queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        burst: float | None = None,
    ) -> QueueState:
        """Cap the queue's jobs running at once across all workers (`concurrency`), and how
        many start per second (`rate`, a token bucket holding `burst`, by default a second's
        worth). None lifts a limit: `limit_queue(name)` lifts both.

        >>> client.limit_queue("emails", concurrency=2, rate=10)    # doctest: +SKIP
        """
        self._db.run(sql.LIMIT_QUEUE, limit_params(name, concurrency, rate, burst))
        return self.queue(name)
