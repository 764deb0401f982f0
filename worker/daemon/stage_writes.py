"""Stage bookkeeping writes from all running jobs, committed together.

A stage's end is committed before the next stage (or cleanup) runs, and its start before it
runs, so a completed stage is never run again and a lost worker's cleanups are known. A commit
waits for the WAL flush, so the writes
are few: a pipeline's first stage starts with the claim (`sql.CLAIM`), a stage's end and the
next one's start are one write, and the last stage's end goes with the job's outcome
(`sql.RECORD_OUTCOMES`): a 3-stage job makes two. Writes that arrive while a flush is in
progress go out together in the next statement (`sql.STAGE_WRITES`): one commit for what all
running jobs wrote meanwhile, and each job still waits for its own write to be committed.

Up to `MAX_FLUSHES` such statements are in flight at once, so a write seldom waits for a whole
commit it is not part of (the server flushes concurrent commits' WAL together). That cannot
reorder one job's writes: a job waits for each write before it makes the next. A write for a
job whose row another client holds locked is skipped by its statement and tried again a
little later; its job waits, the others do not.

    writes = StageWrites(driver, worker_id)
    age = await writes.run(StageWrite(job_id, 0, started="load", kind="stage", attempt=1))
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import psycopg

from worker.daemon.db import LockWaits
from worker.db.driver import Driver, Locked, StageWrite
from worker.db.postgres import TRANSIENT

# Statements in flight at once (each holds a pooled connection while it commits).
MAX_FLUSHES = 3


_Pending = tuple[StageWrite, asyncio.Future[float | None]]


class StageWrites:
    def __init__(self, driver: Driver, worker_id: UUID) -> None:
        self._driver = driver
        self._worker_id = worker_id
        self._pending: list[_Pending] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self._locked = LockWaits("its stage is recorded, and the job goes on,")

    async def run(self, write: StageWrite) -> float | None:
        """Commit `write` in the next shared statement. Returns the seconds since the started
        stage first started (0 if none starts), or None if this worker no longer holds the
        job (it was rescued after a lost heartbeat): then nothing was written."""
        # Cancelling the writer (shutdown) cancels its future, which its batch then skips.
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._pending.append((write, future))
        self._start_flusher()
        return await future

    def _start_flusher(self) -> None:
        if len(self._flushers) < MAX_FLUSHES:
            flusher = asyncio.create_task(self._flush(), name="stage-writes")
            self._flushers.add(flusher)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    ages = await self._write([w for w, _ in batch])
                except TRANSIENT as exc:
                    for _, future in batch:  # each writer retries under its own patience
                        _settle(future, exc=exc)
                    continue
                except psycopg.Error as exc:
                    if len(batch) == 1:
                        _settle(batch[0][1], exc=exc)
                        continue
                    # One write was refused: the others must not fail with it. Alone, each one
                    # succeeds or fails on its own account.
                    for write, future in batch:
                        try:
                            self._answer([(write, future)], await self._write([write]))
                        except (*TRANSIENT, psycopg.Error) as one:
                            _settle(future, exc=one)
                    continue
                except BaseException as exc:
                    for _, future in batch:
                        _settle(future, exc=exc)
                    raise
                self._answer(batch, ages)
        finally:
            # At once: in a done callback, this flusher would still count for a write made
            # before the callback ran, which would then wait for some later write's flusher.
            self._flushers.discard(asyncio.current_task())
            if self._pending:  # it ended on an error, with writes waiting for a flusher
                self._start_flusher()

    def _answer(self, batch: list[_Pending], ages: list[float | Locked | None]) -> None:
        """Settle each write, or set it aside for another try if its job's row was locked."""
        locked: list[_Pending] = []
        for (write, future), age in zip(batch, ages, strict=True):
            if isinstance(age, Locked):
                locked.append((write, future))
            else:
                self._locked.done(write.job_id)
                _settle(future, age=age)
        if not locked:
            return

        def again() -> None:
            self._pending.extend(locked)
            self._start_flusher()

        delay = self._locked.skipped(write.job_id for write, _ in locked)
        asyncio.get_running_loop().call_later(delay, again)

    async def _write(self, batch: list[StageWrite]) -> list[float | Locked | None]:
        return await self._driver.write_stages(self._worker_id, batch)


def _settle(
    future: asyncio.Future[float | None], age: float | None = None, exc: BaseException | None = None
) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(age)
