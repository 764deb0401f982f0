"""Writes job outcomes back in batches: one statement for everything finished since the last.

No fixed delay: the batcher writes as soon as there is something to write, and whatever
finishes during a write goes into the next one. At low load that is one job per statement
(lowest latency); under load it batches by itself (up to `MAX_BATCH`), which is what keeps
the drain rate close to the bare claim/complete loop's.

A job whose row another client holds locked is not waited for (it would hold up every
outcome behind it): the statement skips it and it is written again a little later. A batch
PostgreSQL refuses (a value it cannot store) is written one job at a time, a job whose own
outcome is refused as `failed` naming why: no outcome is dropped and the completer keeps
running. Any other error stops it, and with it the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from uuid import UUID

from worker.daemon.db import LockWaits, Patience
from worker.db.batcher import Batcher, Verdict
from worker.db.driver import Driver, Locked, OutcomeWrite, RecordedOutcome, RetryPolicy
from worker.db.errors import VALUE_REFUSED
from worker.logs import first_line
from worker.models import ClaimedJob, Outcome, OutcomeKind, ProgressEvent, StageEnd, StageStatus
from worker.settings import Settings

log = logging.getLogger("worker.jobs")

MAX_BATCH = 500  # keeps one statement's locks short and its parameters small


class Completer:
    """The outcome writes of one worker, on a `Batcher`."""

    def __init__(
        self,
        driver: Driver,
        worker_id: UUID,
        settings: Settings,
        patience: Patience,
        publish: Callable[[ProgressEvent], None],
        on_written: Callable[[list[RecordedOutcome], list[str]], None] | None = None,
    ) -> None:
        self._driver = driver
        self._worker_id = worker_id
        self._policy = RetryPolicy(settings.retry_backoff_base, settings.retry_backoff_max)
        self._patience = patience
        self._publish = publish
        self._on_written = on_written
        self._batcher: Batcher[OutcomeWrite, RecordedOutcome | None] = Batcher(
            self._write,
            judge=_judge,
            refuse=_refused,
            written=self._written,
            max_batch=MAX_BATCH,
            locks=LockWaits("its outcome is written"),
            job_of=_job_of,
            name="completer",
        )

    def add(self, job: ClaimedJob, outcome: Outcome) -> None:
        """Queue the outcome of the attempt that claimed `job`."""
        self._batcher.add(OutcomeWrite(job.id, job.retry_count, outcome, job.max_retries))

    @property
    def pending(self) -> int:
        return self._batcher.pending

    async def run(self) -> None:
        await self._batcher.run()

    async def drain(self) -> None:
        """Wait until everything handed over so far is written (or the completer has ended)."""
        await self._batcher.drain()

    async def _write(self, batch: list[OutcomeWrite]) -> list[RecordedOutcome | Locked | None]:
        return await self._patience.run(
            "recording job outcomes",
            lambda: self._driver.record_outcomes(self._worker_id, self._policy, batch),
            past_stop=True,  # a stopping worker still writes what its jobs did
        )

    def _written(
        self,
        batch: list[OutcomeWrite],
        answers: Sequence[RecordedOutcome | Locked | None] | None,
    ) -> None:
        recorded: list[RecordedOutcome] = []
        refused: list[str] = []  # no longer ours: rescued, or its claim was lost
        if answers is None:  # a write that answers nothing records and refuses nothing
            batch, answers = [], []
        for item, answer in zip(batch, answers, strict=True):
            if isinstance(answer, RecordedOutcome):
                if item.outcome.error is not None:
                    answer = replace(answer, error=item.outcome.error)
                recorded.append(answer)
                # The events reporting an outcome go out once it is written; those of an
                # outcome refused (the job is no longer ours) never do.
                for event in item.outcome.events:
                    if _agrees(event, answer.status):
                        self._publish(event)
            elif answer is None:
                refused.append(item.job_id)
        if self._on_written is not None:
            self._on_written(recorded, refused)


def _job_of(item: OutcomeWrite) -> str:
    return item.job_id


def _judge(batch: list[OutcomeWrite], exc: Exception, alone: bool) -> Verdict:
    if not isinstance(exc, (*VALUE_REFUSED, UnicodeError)):
        return Verdict.RAISE
    if not alone:
        log.error("a batch of outcomes was refused (%s); writing them one by one", exc)
    return Verdict.SPLIT


def _refused(item: OutcomeWrite, exc: Exception) -> OutcomeWrite:
    """The job's own outcome cannot be stored: it fails, naming why."""
    reason = first_line(exc)
    outcome = item.outcome
    outcome.events = []  # they report the outcome that was not written
    end = outcome.stage_end and StageEnd(outcome.stage_end.stage, StageStatus.FAILED)
    refused = Outcome(
        OutcomeKind.FAILED,
        error=f"the job's outcome could not be stored: {type(exc).__name__}: {reason}",
        stage_end=end,
    )
    return OutcomeWrite(item.job_id, item.retries, refused, item.max_retries)


def _agrees(event: ProgressEvent, status: str) -> bool:
    """Whether an event agrees with the job status written: a cancel request turns a pause, or
    a last attempt's failure, into `pending` (the job goes back to run its cleanup)."""
    if event.step == "job" or event.status == "paused":
        return event.status == status
    return True
