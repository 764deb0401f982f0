"""The asyncio client: the one implementation of both clients.

`AsyncClient` enqueues (one job or a batch, on its own kept connections or in the caller's
transaction) and acts on jobs (get, cancel, resume, retry, prune). The blocking `Client` is
generated from this file into `worker.client._sync` by `scripts/unasync.py`: edit here, then
run it. What may differ between the two lives in the parts each side names (`AsyncDatabase`
and `Database`), never in this logic.
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
from worker.db.client_async import AsyncDatabase
from worker.db.embedded import database_url
from worker.db.targets import AsyncTarget
from worker.ids import new_job_id
from worker.models import JSON, TERMINAL_STATUSES, JobStatus
from worker.settings import get_settings
from worker.urls import psycopg_url


class AsyncClient:
    """The asyncio client: enqueue jobs, read them, cancel, resume, retry and prune them.

    `connection=` joins the caller's transaction (a SQLAlchemy `AsyncConnection` or
    `AsyncSession`, on the psycopg or asyncpg driver, or a psycopg `AsyncConnection`): the
    job then exists if and only if that transaction commits, and no worker sees it before.

    >>> client = AsyncClient()                                          # doctest: +SKIP
    >>> async with engine.begin() as conn:                              # doctest: +SKIP
    ...     await conn.execute(orders.insert().values(id=42))
    ...     await client.enqueue("ship_order", {"order": 42}, connection=conn)
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = psycopg_url(url) if url else database_url()
        self._db = AsyncDatabase(self.url)
        self.engine = self._db.engine
        self.max_payload_bytes = get_settings().max_payload_bytes

    async def close(self) -> None:
        """Close the client's idle connections (it opens new ones if used again).

        >>> await client.close()                                    # doctest: +SKIP
        """
        await self._db.close()

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
        unique_key: str | None = None,
        concurrency_key: str | None = None,
        connection: AsyncTarget = None,
    ) -> Job:
        """Enqueue one job; returns its handle. Refused with `InvalidJob` before anything is
        written if the payload is not a JSON object or an option is out of range.

        With `unique_key`, while a pending, processing or paused job holds that key, nothing
        is inserted: the handle is that job's, with `duplicate` true. Jobs sharing a
        `concurrency_key` run at most their task's `concurrency` at once (1 by default).

        >>> await client.enqueue("send_email", {"to": "ada@example.com"})  # doctest: +SKIP
        >>> await client.enqueue("bill", {"id": 42}, unique_key="bill:42")  # doctest: +SKIP
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
            ((id_, due),) = await self._db.insert(statement, again, params, connection, True)
            return new_job(id_, spec, self, due)
        for _ in range(UNIQUE_TRIES):
            statement = sql.ENQUEUE_UNIQUE  # safe to run again, as it is
            found = await self._db.insert(statement, statement, params, connection, True)
            if found:
                ((id_, due),) = found
                return new_job(id_, spec, self, due, duplicate=str(id_) != params["id"])
        raise unsettled_key(unique_key)

    @overload
    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
    ) -> list[Job]: ...

    @overload
    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
        on_complete: Callback,
        on_failure: Callback | None = None,
    ) -> BatchJobs: ...

    @overload
    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
        on_complete: Callback | None = None,
        on_failure: Callback,
    ) -> BatchJobs: ...

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
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

        >>> await client.enqueue_many([("resize", {"id": i}) for i in range(50)])  # doctest: +SKIP
        >>> await client.enqueue_many(specs, on_complete="report")   # doctest: +SKIP
        """
        if on_complete is not None or on_failure is not None:
            prepared = with_callbacks(jobs, on_complete, on_failure, self.max_payload_bytes)
            statement = sql.ENQUEUE_WORKFLOW  # idempotent by the workflow's id: safe to run again
            await self._db.insert(statement, statement, prepared.params, connection, True)
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
            found = await self._insert_unique(batch.sent(), connection, trace)
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
            await self._db.copy(
                copy,
                batch.copy_chunks(trace),
                sql.ENQUEUE_MANY_AGAIN,
                lambda: traced(batch.params(), trace),
                meanwhile=handles,
            )
        else:
            params = traced(batch.params(), trace)
            statement, again = sql.ENQUEUE_MANY, sql.ENQUEUE_MANY_AGAIN
            await self._db.insert(statement, again, params, connection, False)
        return handles()

    async def _insert_unique(
        self, batch: Batch, connection: AsyncTarget, trace: str | None
    ) -> dict[str, str]:
        """Each job's id in the database, by the id it was sent with: its own, or that of the
        live job holding its unique key."""
        found: dict[str, str] = {}
        for _ in range(UNIQUE_TRIES):
            params = traced(batch.params(), trace)
            statement = sql.ENQUEUE_MANY_UNIQUE  # safe to run again, as it is
            rows_ = await self._db.insert(statement, statement, params, connection, True)
            found.update({str(asked): str(id_) for asked, id_ in rows_ if id_ is not None})
            batch = batch.without(found)
            if not batch.ids:
                return found
        raise unsettled_key(str(batch.rows[0]["unique_key"]))

    async def get(self, job_id: str | UUID) -> Job:
        """The job's current state, with its stages; `JobNotFound` if there is no such job."""
        found = await self._db.read_job(sql.GET_JOB, sql.GET_STAGES, {"id": job_id_of(job_id)})
        if found is None:
            raise JobNotFound(f"no job {job_id}")
        row, stages = found
        return job_from_row(row, stages, self)

    async def cancel(self, job_id: str | UUID) -> JobStatus:
        """Cancel a job: at once if it has not started, else at its next stage boundary.
        Returns the status after the request (a finished job's status is returned as is)."""
        (row,) = await self._db.run(sql.CANCEL, {"id": job_id_of(job_id)})
        return cancel_result(str(job_id), row)

    async def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        """Answer a paused job's question; it goes back to `pending`.

        >>> await client.resume(job_id, {"approved": True})     # doctest: +SKIP
        """
        params = {
            "id": job_id_of(job_id),
            "answer": stored_json(answer, "answer", self.max_payload_bytes),
        }
        if not await self._db.run(sql.RESUME, params):
            job = await self.get(job_id)
            raise InvalidTransition(f"job {job_id} is {job.status}, not paused: nothing to resume")
        return await self.get(job_id)

    async def retry(self, job_id: str | UUID) -> Job:
        """Run a failed or cancelled job again, with fresh retries."""
        if not await self._db.run(sql.RETRY, {"id": job_id_of(job_id)}):
            job = await self.get(job_id)
            raise InvalidTransition(retry_refused(job))
        return await self.get(job_id)

    async def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs that finished longer ago than `older_than` ("7d", "12h",
        seconds or a timedelta), with their stages and events. Each batch of `batch_size` is
        its own short transaction, so no lock is held for long. Returns how many were removed.

        >>> await client.cleanup_jobs(older_than="30d", statuses=["completed"])   # doctest: +SKIP
        1200
        """
        params = prune_params(older_than, statuses, batch_size)
        removed = 0
        while True:
            n: int = await self._db.run(sql.PRUNE_BATCH, params)
            removed += n
            if n < batch_size:
                return removed

    # -- queues -----------------------------------------------------------------------------

    async def queues(self) -> list[QueueState]:
        """Every queue with live jobs or controls: paused or not, its limits, its depth."""
        return [QueueState.of(row) for row in await self._db.run(sql.QUEUE_STATES, {"name": None})]

    async def queue(self, name: str) -> QueueState:
        """One queue's state (an unknown queue is running, unlimited and empty)."""
        params = {"name": queue_name(name)}
        found = [QueueState.of(row) for row in await self._db.run(sql.QUEUE_STATES, params)]
        return found[0] if found else QueueState(name, False, None, None, None, 0, 0)

    async def pause_queue(self, name: str) -> QueueState:
        """Stop every worker claiming from the queue, from its next claim on; running jobs
        finish. A job whose cancel was requested still settles.

        >>> await client.pause_queue("emails")                      # doctest: +SKIP
        """
        await self._db.run(sql.PAUSE_QUEUE, {"name": queue_name(name)})
        return await self.queue(name)

    async def resume_queue(self, name: str) -> QueueState:
        """Let workers claim from the queue again, waking the idle ones at once."""
        await self._db.run(sql.RESUME_QUEUE, {"name": queue_name(name)})
        return await self.queue(name)

    async def limit_queue(
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

        >>> await client.limit_queue("emails", concurrency=2, rate=10)    # doctest: +SKIP
        """
        await self._db.run(sql.LIMIT_QUEUE, limit_params(name, concurrency, rate, burst))
        return await self.queue(name)
