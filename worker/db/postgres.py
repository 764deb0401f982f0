"""The PostgreSQL driver: the daemon's and the bus's operations over psycopg pools.

`PostgresDriver` implements `worker.db.driver.Driver` with the statements of `worker.db.sql`
on pools made by `worker.db.connect.async_pool`: one for every statement but the claim, and
the claim loop's own connection, whose session keeps the claim's plan. Broken pooled
connections are dropped on first use and replaced. The pool gives up each reconnection attempt
after `RECONNECT_WINDOW` seconds, so the next statement starts a fresh attempt at once: left
to itself, the pool's backoff keeps doubling through a long outage and would leave the worker
idle for long after the database came back.

What this does not do: it does not retry a statement, nor log an outage (the daemon's
`Patience` does both); it raises the `TRANSIENT` errors as they come.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.pq import Format
from psycopg.types.json import set_json_loads
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from worker.db import console, sql
from worker.db.connect import aconnect, async_pool, pooled
from worker.db.driver import (
    LOCKED,
    Beat,
    ClaimSpec,
    EventWrite,
    Locked,
    OutcomeWrite,
    RecordedOutcome,
    Registration,
    RescuedJob,
    RetryPolicy,
    StagePlans,
    StageWrite,
    UnreadableJSON,
)
from worker.db.errors import EVENTS_REFUSED, Refused
from worker.db.notifier import Subscription, notifier
from worker.db.records import array_literal, json_records
from worker.models import ClaimedJob, JobStatus, ProgressEvent, StageHistory, StageRow

POOL_CAP = 16  # connections per worker process, whatever its concurrency
POOL_WAIT = 5.0  # seconds a statement waits for a pooled connection before it is retried
RECONNECT_WINDOW = 3.0  # seconds the pool keeps retrying one reconnection before giving up


def pool_size(concurrency: int) -> int:
    """Connections the daemon may open (its pool and the claim loop's) for a given
    `WORKER_CONCURRENCY`.

    A running job holds no connection (see `Worker`): the claim loop, the completer and the
    duties need one each, stage bookkeeping a few more. Capped, so that many busy workers do
    not exhaust the server's `max_connections`.

    >>> pool_size(1), pool_size(10), pool_size(1000)
    (4, 8, 16)
    """
    return min(3 + max(1, concurrency // 2), POOL_CAP)


# A dict lookup per row read: calling the enum class runs its metaclass's lookup each time.
_JOB_STATUS = {status.value: status for status in JobStatus}


def _loads(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        return UnreadableJSON("it is nested more deeply than Python's JSON decoder allows")


# Ids are read as text: the daemon only passes them on (as keys, log fields, parameters), and a
# UUID object built per id, then turned back into text several times, costs more than the rest
# of reading the row. (The text loader psycopg uses itself: its C one, when installed.)
_TEXT_LOADER = (
    psycopg.adapters.get_loader(psycopg.adapters.types["text"].oid, Format.TEXT) or TextLoader
)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_loads, conn)
    conn.adapters.register_loader("uuid", _TEXT_LOADER)


async def _configure_claims(conn: psycopg.AsyncConnection[Any]) -> None:
    await _configure(conn)
    # The claim is planned once per session, not once per claim. Left to choose, PostgreSQL
    # plans it anew every time (planning it costs as much as running it): its plan for
    # "LIMIT n" looks cheaper than one for any limit. The claim is written so that the
    # plan for any limit makes the same index probes (see `worker.db.sql.claim`). Behind a
    # transaction pooler nothing is prepared, so there is no plan to keep, and a session's
    # setting would reach the pool's other clients: none is made.
    if not pooled():
        await conn.execute("SET plan_cache_mode = force_generic_plan")


def make_pool(url: str, concurrency: int) -> AsyncConnectionPool:
    """The pool of every statement but the claim: `pool_size(concurrency)` less the claim's."""
    size = pool_size(concurrency) - 1
    return _pool(url, min(2, size), size, _configure, "worker")


def claim_pool(url: str, liveness_key: int | None = None) -> AsyncConnectionPool:
    """The claim loop's own connection: its session keeps the claim's plan, and holds the
    worker's liveness lock (`sql.HOLD_LIVENESS`) when given its key."""

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await _configure_claims(conn)
        if liveness_key is not None:
            await conn.execute(sql.HOLD_LIVENESS, {"key": liveness_key})

    return _pool(url, 1, 1, configure, "worker-claims")


def _pool(
    url: str,
    min_size: int,
    max_size: int,
    configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
    name: str,
) -> AsyncConnectionPool:
    # Named "durable-worker" whichever pool: operators and the tests find the daemon's
    # sessions by that name; the pool's own name tells them apart in its logs.
    pool = async_pool(
        url,
        "durable-worker",
        min_size=min_size,
        max_size=max_size,
        configure=configure,
        timeout=POOL_WAIT,
        reconnect_timeout=RECONNECT_WINDOW,
    )
    pool.name = name
    return pool


async def fetch(
    pool: AsyncConnectionPool,
    query: str,
    params: dict[str, Any],
) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        try:
            cur = await conn.execute(query, params)
        except psycopg.errors.ProgramLimitExceeded as exc:
            raise Refused(str(exc).strip()) from exc
        # `rownumber` is None without a result set; `description` would build its columns.
        return await cur.fetchall() if cur.rownumber is not None else []


def _event_record(e: EventWrite) -> str:
    """The event as a JSON object for `sql.PUBLISH_EVENTS`, put together directly: a pipeline
    job publishes several events, and this costs a fraction of encoding a dict per event."""
    message = "" if e.message is None else f',"message":{e.message}'
    return (
        f'{{"job_id":{_text(e.job_id)},"step":{_text(e.step)},"status":{_text(e.status)},'
        f'"created_at":"{e.created_at.isoformat()}"{message}}}'
    )


_text = json.JSONEncoder(ensure_ascii=False).encode

EVENTS_APPLICATION_NAME = "durable-worker-events"


# The listening session's name, unless the operator named the process's sessions.
LISTENER_NAME = "durable-worker-listener"


class PostgresDriver:
    """`worker.db.driver.Driver` on PostgreSQL. The daemon's pools are made at once and opened
    by `open`; the bus's connections (one writer, a small pool of readers) on first use."""

    def __init__(self, url: str, concurrency: int = 1, *, events_readers: int = 4) -> None:
        self.url = url
        # Behind a transaction pooler no session lasts: no lock can outlive a transaction.
        self.liveness_key = None if pooled() else secrets.randbelow(2**31 - 1) + 1
        self.pool: AsyncConnectionPool[Any] = make_pool(url, concurrency)
        self.claims: AsyncConnectionPool[Any] = claim_pool(url, self.liveness_key)
        self.events_connection: psycopg.AsyncConnection[Any] | None = None
        self._events_readers: AsyncConnectionPool[Any] | None = None
        self._events_readers_size = events_readers
        # A worker's claim spec, as the claim's parameters: made once, not at every claim.
        self._claim_spec: tuple[ClaimSpec, dict[str, Any]] | None = None

    async def open(self) -> None:
        await self.pool.open(wait=False)
        await self.claims.open(wait=False)

    async def close(self) -> None:
        if self._events_readers is not None:
            await self._events_readers.close()
            self._events_readers = None
        if self.events_connection is not None:
            await self.events_connection.close()
            self.events_connection = None
        await self.claims.close()
        await self.pool.close()
        # The listening session this driver's subscriptions used goes now, not a linger later,
        # unless someone else in the process still listens.
        notifier(self.url, LISTENER_NAME).retire_if_unused()

    async def confirm_reachable(self) -> None:
        # A new session is the proof: a server shutting down still answers on sessions it has
        # not cut yet, but accepts no new ones. Then sessions idle in the pool since before the
        # outage, likely dead, are replaced rather than left to fail the next statements.
        async with await aconnect(self.url, "durable-worker", autocommit=False):
            pass
        await self.pool.check()
        await self.claims.check()

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> Subscription:
        # The process's one LISTEN connection; it logs its own losses and reconnections.
        return notifier(self.url, LISTENER_NAME).subscribe_async(channel, callback)

    # -- liveness ---------------------------------------------------------------------------

    async def register_worker(self, registration: Registration) -> None:
        await fetch(self.pool, sql.REGISTER_WORKER, _registration(registration))

    async def heartbeat(
        self,
        registration: Registration,
        registered_again: Callable[[], None] | None = None,
        cancels: bool = True,
    ) -> Beat:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.HEARTBEAT, {"id": registration.id})
            again = cur.rowcount == 0
            if again:
                await conn.execute(sql.REGISTER_WORKER, _registration(registration))
                if registered_again is not None:
                    registered_again()
            if not cancels:
                return Beat(again, [])
            cur = await conn.execute(sql.CANCEL_REQUESTED, {"worker_id": registration.id})
            return Beat(again, [job_id for (job_id,) in await cur.fetchall()])

    async def deregister_worker(self, worker_id: UUID) -> None:
        await fetch(self.pool, sql.DEREGISTER_WORKER, {"id": worker_id})

    async def rescue(
        self, lease: float, grace: float, still_sure: Callable[[], bool], starting: bool = False
    ) -> list[RescuedJob]:
        async with self.pool.connection() as conn:
            if not still_sure():
                return []
            cur = await conn.execute(
                sql.RESCUE, {"lease": lease, "grace": grace, "starting": starting}
            )
            rows = await cur.fetchall()
        return [RescuedJob(job_id, task, queue) for job_id, task, queue, _ in rows]

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, spec: ClaimSpec, limit: int, running: list[str]) -> list[ClaimedJob]:
        statement = sql.CLAIM_ONE_QUEUE if len(spec.queues) == 1 else sql.CLAIM
        if self._claim_spec is None or self._claim_spec[0] is not spec:
            self._claim_spec = (spec, _claim_params(spec))
        params = {
            **self._claim_spec[1],
            "limit": limit,
            "running": array_literal(running),
        }
        return [ClaimedJob(*row) for row in await fetch(self.claims, statement, params)]

    async def release(self, worker_id: UUID, ids: list[str]) -> None:
        await fetch(self.pool, sql.RELEASE, {"worker_id": worker_id, "ids": ids})

    async def held_jobs(self, worker_id: UUID) -> set[str]:
        rows = await fetch(self.pool, sql.HELD_JOBS, {"worker_id": worker_id})
        return {job_id for (job_id,) in rows}

    # -- outcomes and stages ----------------------------------------------------------------

    async def record_outcomes(
        self, worker_id: UUID, policy: RetryPolicy, batch: Sequence[OutcomeWrite]
    ) -> list[RecordedOutcome | Locked | None]:
        outcomes = json_records(
            [
                (
                    {
                        "id": w.job_id,
                        "retries": w.retries,
                        "max_retries": w.max_retries,
                        "outcome": o.kind,
                        "error": o.error,
                        "delay": o.delay,
                        "stage": o.stage_end.stage if o.stage_end else None,
                        "stage_status": o.stage_end.status if o.stage_end else None,
                    },
                    {
                        "result": o.result_json,
                        "stage_output": o.stage_end.output if o.stage_end else None,
                    },
                )
                for w in batch
                for o in (w.outcome,)
            ]
        )
        rows = await fetch(
            self.pool,
            sql.RECORD_OUTCOMES,
            {
                "outcomes": outcomes,
                "worker_id": worker_id,
                "backoff_base": policy.backoff_base,
                "backoff_max": policy.backoff_max,
            },
        )
        # A NULL status: the job is ours, but its row was locked. No row: no longer ours.
        answers: dict[str, RecordedOutcome | Locked] = {
            job_id: LOCKED
            if status is None
            else RecordedOutcome(
                job_id,
                _JOB_STATUS[status],
                task,
                queue,
                retries,
                None if duration is None else float(duration),
            )
            for job_id, status, task, queue, retries, duration, _ in rows
        }
        return [answers.get(w.job_id) for w in batch]

    async def write_stages(
        self, worker_id: UUID, batch: Sequence[StageWrite]
    ) -> list[float | Locked | None]:
        writes = json_records(
            (
                {
                    "n": n,
                    "job": w.job_id,
                    "retries": w.retries,
                    "ended": w.ended,
                    "status": w.status,
                    "error": w.error,
                    "started": w.started,
                    "kind": w.kind,
                    "attempt": w.attempt,
                },
                {"output": w.output, "waiting": json.dumps(w.waiting) if w.waiting else None},
            )
            for n, w in enumerate(batch)
        )
        rows = await fetch(self.pool, sql.STAGE_WRITES, {"writes": writes, "worker_id": worker_id})
        # A NULL age: the job is ours, but its row was locked. No row: no longer ours.
        ages: dict[int, float | Locked] = {
            n: LOCKED if age is None else float(age) for n, age in rows
        }
        return [ages.get(n) for n in range(len(batch))]

    async def load_stages(self, job_id: str) -> StageHistory:
        rows = await fetch(self.pool, sql.LOAD_STAGES, {"id": job_id})
        stages = [
            StageRow(stage, kind, status, output, error, attempt)
            for stage, kind, status, output, error, attempt, _ in rows
        ]
        owed = next((owed for *_, owed in rows), None)  # every row carries the same
        return StageHistory(stages, owed)

    async def record_final_error(
        self, worker_id: UUID, job_id: str, retries: int, error: str
    ) -> bool:
        params = {"id": job_id, "error": error, "worker_id": worker_id, "retries": retries}
        return bool(await fetch(self.pool, sql.RECORD_FINAL_ERROR, params))

    # -- housekeeping -----------------------------------------------------------------------

    async def prune(self, statuses: list[str], before: datetime, batch: int) -> int:
        async with self.pool.connection() as conn:
            params = {"statuses": statuses, "before": before, "batch": batch}
            cur = await conn.execute(sql.PRUNE_BATCH, params)
        return int(cur.rowcount)

    # -- periodic tasks ---------------------------------------------------------------------

    async def fire_tick(
        self, key: str, task: str, spec: str, tick: datetime, queue: str
    ) -> str | None:
        params = {"key": key, "task": task, "spec": spec, "tick": tick, "queue": queue}
        rows = await fetch(self.pool, sql.FIRE_TICK, params)
        return str(rows[0][0]) if rows else None

    async def publish_stage_plans(self, plans: StagePlans) -> None:
        async with self.pool.connection() as conn:
            await console.publish_stages(conn, plans)

    async def publish_task_limits(self, limits: Mapping[str, int]) -> None:
        async with self.pool.connection() as conn:
            await console.publish_limits(conn, limits)

    async def roll_up(self) -> bool:
        async with self.pool.connection() as conn:
            return await console.roll_up(conn)

    # -- progress events --------------------------------------------------------------------

    async def publish_events(self, batch: Sequence[EventWrite]) -> list[str]:
        if self.events_connection is None or self.events_connection.closed:
            self.events_connection = await aconnect(self.url, EVENTS_APPLICATION_NAME)
        events = f"[{','.join(map(_event_record, batch))}]"
        try:
            cur = await self.events_connection.execute(sql.PUBLISH_EVENTS, {"events": events})
            row = await cur.fetchone()
        except EVENTS_REFUSED:
            raise
        except Exception:
            # The connection may be broken: the next write opens another.
            await self.events_connection.close()
            self.events_connection = None
            raise
        if row is None:
            return []
        _notified, gone = row
        return list(gone or ())

    async def read_events(self, job_id: str, after: int, limit: int) -> list[ProgressEvent]:
        if self._events_readers is None:
            self._events_readers = async_pool(
                self.url,
                EVENTS_APPLICATION_NAME,
                min_size=1,
                max_size=self._events_readers_size,
                timeout=10.0,
                reconnect_timeout=float("inf"),
                # Readers idle between streams: one cut meanwhile must not end the next stream.
                check=True,
            )
            await self._events_readers.open(wait=False)
        async with self._events_readers.connection() as conn:
            cur = await conn.execute(
                sql.READ_EVENTS, {"job_id": job_id, "after": after, "limit": limit}
            )
            rows = await cur.fetchall()
        return [
            ProgressEvent(
                id=id_, job_id=str(job), step=step, status=status, message=message, created_at=at
            )
            for id_, job, step, status, message, at in rows
        ]


def _claim_params(spec: ClaimSpec) -> dict[str, Any]:
    """The parameters every claim of `spec` passes, its lists as array literals."""
    return {
        "queues": array_literal(spec.queues),
        "tasks": array_literal(spec.tasks),
        "worker_id": spec.worker_id,
        "default_max_retries": spec.default_max_retries,
        "pipelines": array_literal(spec.pipelines),
        "first_stages": array_literal(spec.first_stages),
        "retry_tasks": array_literal(spec.retry_tasks),
        "retry_limits": array_literal(spec.retry_limits),
        "key_tasks": array_literal(spec.key_tasks),
        "key_limits": array_literal(spec.key_limits),
    }


def _registration(r: Registration) -> dict[str, Any]:
    return {
        "id": r.id,
        "hostname": r.hostname,
        "pid": r.pid,
        "queues": r.queues,
        "concurrency": r.concurrency,
        "liveness_key": r.liveness_key,
        "tasks": r.tasks,
        "lease_seconds": r.lease_seconds,
    }
