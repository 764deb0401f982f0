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
from uuid import UUID

import psycopg

from worker.attempt import Outcome, OutcomeKind, StageEnd
from worker.daemon.db import LockWaits, Patience
from worker.db.driver import Driver, Locked, OutcomeWrite, RecordedOutcome, RetryPolicy
from worker.models import ProgressEvent, StageStatus
from worker.settings import Settings

log = logging.getLogger("worker.jobs")

MAX_BATCH = 500  # keeps one statement's locks short and its parameters small

Item = OutcomeWrite


class Completer:
    def __init__(
        self,
        driver: Driver,
        worker_id: UUID,
        settings: Settings,
        patience: Patience,
        publish: Callable[[ProgressEvent], None],
        on_recorded: Callable[[list[RecordedOutcome]], None] | None = None,
    ) -> None:
        self._driver = driver
        self._worker_id = worker_id
        self._policy = RetryPolicy(
            settings.max_retries, settings.retry_backoff_base, settings.retry_backoff_max
        )
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
        self._queue.append(OutcomeWrite(job_id, retries, outcome))
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
                locked: list[Item] = []
                recorded: list[RecordedOutcome] = []
                for item, answer in zip(batch, rows, strict=True):
                    if isinstance(answer, Locked):
                        locked.append(item)
                        continue
                    self._locked.done(item.job_id)
                    if answer is not None:
                        recorded.append(answer)
                        # The events reporting an outcome go out once it is written; those of
                        # an outcome refused (the job is no longer ours) never do.
                        for event in item.outcome.events:
                            if _agrees(event, answer.status):
                                self._publish(event)
                if locked:
                    self._retry_locked(locked)
                if self._on_recorded is not None:
                    self._on_recorded(recorded)
            if not self._locked:
                self._idle.set()

    def _retry_locked(self, items: list[Item]) -> None:
        def again() -> None:
            self._queue.extend(items)
            self._ready.set()

        delay = self._locked.skipped(item.job_id for item in items)
        asyncio.get_running_loop().call_later(delay, again)

    async def _write_each(
        self, batch: list[Item], error: Exception
    ) -> list[RecordedOutcome | Locked | None]:
        """PostgreSQL refused a batch (a value it cannot store): write its jobs one at a time,
        a job whose own outcome is refused as `failed` naming why. No outcome is dropped and
        the flusher keeps running."""
        log.error("a batch of outcomes was refused (%s); writing them one by one", error)
        rows: list[RecordedOutcome | Locked | None] = []
        for job_id, retries, outcome in ((i.job_id, i.retries, i.outcome) for i in batch):

            async def write(item: Item) -> list[RecordedOutcome | Locked | None]:
                return await self._patience.run(
                    "recording job outcomes", lambda: self._write([item]), past_stop=True
                )

            try:
                rows += await write(OutcomeWrite(job_id, retries, outcome))
            except (psycopg.DataError, UnicodeError) as exc:
                reason = (str(exc).strip().splitlines() or [""])[0]
                outcome.events = []  # they report the outcome that was not written
                end = outcome.stage_end and StageEnd(outcome.stage_end.stage, StageStatus.FAILED)
                refused = Outcome(
                    OutcomeKind.FAILED,
                    error=f"the job's outcome could not be stored: {type(exc).__name__}: {reason}",
                    stage_end=end,
                )
                rows += await write(OutcomeWrite(job_id, retries, refused))
        return rows

    async def drain(self) -> None:
        """Wait until everything handed over so far is written (or the completer has ended)."""
        await self._idle.wait()

    async def _write(self, batch: list[Item]) -> list[RecordedOutcome | Locked | None]:
        return await self._driver.record_outcomes(self._worker_id, self._policy, batch)


def _agrees(event: ProgressEvent, status: str) -> bool:
    """Whether an event agrees with the job status written: a cancel request turns a pause, or
    a last attempt's failure, into `pending` (the job goes back to run its cleanup)."""
    if event.step == "job" or event.status == "paused":
        return event.status == status
    return True
