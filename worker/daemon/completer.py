"""Writes job outcomes back in batches: one statement for everything finished since the last.

No fixed delay: the flusher writes as soon as there is something to write, and whatever
finishes during a write goes into the next one. At low load that is one job per statement
(lowest latency); under load it batches by itself (up to `MAX_BATCH`), which is what keeps
the drain rate close to the bare claim/complete loop's.

A job whose row another client holds locked is not waited for (it would hold up every
outcome behind it): the statement skips it and it is written again a little later.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.attempt import Outcome, OutcomeKind, StageEnd
from worker.daemon.db import LockWaits, Patience, fetch
from worker.db import sql
from worker.db.records import json_records
from worker.models import ProgressEvent, StageStatus
from worker.settings import Settings

log = logging.getLogger("worker.jobs")

MAX_BATCH = 500  # keeps one statement's locks short and its parameters small

Item = tuple[str, int, Outcome]  # a job, its retry_count as claimed, how the attempt ended


class Completer:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        worker_id: UUID,
        settings: Settings,
        patience: Patience,
        publish: Callable[[ProgressEvent], None],
        on_recorded: Callable[[list[tuple[Any, ...]]], None] | None = None,
    ) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._settings = settings
        self._patience = patience
        self._publish = publish
        self._on_recorded = on_recorded
        self._queue: list[Item] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._locked = LockWaits("its outcome is written")

    def add(self, job_id: str, retries: int, outcome: Outcome) -> None:
        """Queue the outcome of the attempt that claimed the job with `retries`."""
        self._queue.append((job_id, retries, outcome))
        self._idle.clear()
        self._ready.set()

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._locked)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            # Failed, or cancelled by the shutdown: nothing more is written, so a drain waits
            # no longer. What is left counts in `pending`.
            self._idle.set()

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                # The batch leaves the queue once written: outcomes added meanwhile go after it.
                batch = self._queue[:MAX_BATCH]
                try:
                    rows = await self._patience.run(
                        "recording job outcomes",
                        functools.partial(self._write, batch),
                        past_stop=True,  # a stopping worker still writes what its jobs did
                    )
                except (psycopg.DataError, UnicodeError) as exc:
                    rows = await self._write_each(batch, exc)
                del self._queue[: len(batch)]
                locked = {row[0] for row in rows if row[1] is None}
                for job_id, _, _ in batch:
                    if job_id not in locked:
                        self._locked.done(job_id)
                if locked:
                    self._retry_locked([item for item in batch if item[0] in locked])
                recorded = [row for row in rows if row[1] is not None]
                # The events reporting an outcome go out once it is written; those of an
                # outcome refused (the job is no longer ours) never do.
                outcomes = {job_id: outcome for job_id, _, outcome in batch}
                for job_id, status, *_ in recorded:
                    for event in outcomes[job_id].events:
                        if _agrees(event, status):
                            self._publish(event)
                if self._on_recorded is not None:
                    self._on_recorded(recorded)
            if not self._locked:
                self._idle.set()

    def _retry_locked(self, items: list[Item]) -> None:
        def again() -> None:
            self._queue.extend(items)
            self._ready.set()

        delay = self._locked.skipped(job_id for job_id, _, _ in items)
        asyncio.get_running_loop().call_later(delay, again)

    async def _write_each(self, batch: list[Item], error: Exception) -> list[tuple[Any, ...]]:
        """PostgreSQL refused a batch (a value it cannot store): write its jobs one at a time,
        a job whose own outcome is refused as `failed` naming why. No outcome is dropped and
        the flusher keeps running."""
        log.error("a batch of outcomes was refused (%s); writing them one by one", error)
        rows: list[tuple[Any, ...]] = []
        for job_id, retries, outcome in batch:

            async def write(item: Item) -> list[tuple[Any, ...]]:
                return await self._patience.run(
                    "recording job outcomes", lambda: self._write([item]), past_stop=True
                )

            try:
                rows += await write((job_id, retries, outcome))
            except (psycopg.DataError, UnicodeError) as exc:
                reason = (str(exc).strip().splitlines() or [""])[0]
                outcome.events = []  # they report the outcome that was not written
                end = outcome.stage_end and StageEnd(outcome.stage_end.stage, StageStatus.FAILED)
                refused = Outcome(
                    OutcomeKind.FAILED,
                    error=f"the job's outcome could not be stored: {type(exc).__name__}: {reason}",
                    stage_end=end,
                )
                rows += await write((job_id, retries, refused))
        return rows

    async def drain(self) -> None:
        """Wait until everything handed over so far is written (or the completer has ended)."""
        await self._idle.wait()

    async def _write(self, batch: list[Item]) -> list[tuple[Any, ...]]:
        s = self._settings
        outcomes = json_records(
            (
                {
                    "id": job_id,
                    "retries": retries,
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
            for job_id, retries, o in batch
        )
        return await fetch(
            self._pool,
            sql.RECORD_OUTCOMES,
            {
                "outcomes": outcomes,
                "worker_id": self._worker_id,
                "default_max_retries": s.max_retries,
                "backoff_base": s.retry_backoff_base,
                "backoff_max": s.retry_backoff_max,
            },
        )


def _agrees(event: ProgressEvent, status: str) -> bool:
    """Whether an event agrees with the job status written: a cancel request turns a pause, or
    a last attempt's failure, into `pending` (the job goes back to run its cleanup)."""
    if event.step == "job" or event.status == "paused":
        return event.status == status
    return True
