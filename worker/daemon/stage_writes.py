"""Stage bookkeeping writes from all running jobs, committed together.

A stage's end is committed before the next stage (or cleanup) runs, and its start before it
runs, so a completed stage is never run again and a lost worker's cleanups are known. A commit
waits for the WAL flush, so the writes are few: a pipeline's first stage starts with the
claim (`sql.CLAIM`), a stage's end and the next one's start are one write, and the last
stage's end goes with the job's outcome (`sql.RECORD_OUTCOMES`): a 3-stage job makes two.
Writes that arrive while a flush is in progress go out together in the next statement
(`sql.STAGE_WRITES`): one commit for what all running jobs wrote meanwhile, and each job
still waits for its own write to be committed.

Up to `MAX_FLUSHES` such statements are in flight at once, so a write seldom waits for a whole
commit it is not part of (the server flushes concurrent commits' WAL together). That cannot
reorder one job's writes: a job waits for each write before it makes the next. A write for a
job whose row another client holds locked is skipped by its statement and tried again a
little later; its job waits, the others do not.

    writes = StageWrites(driver, worker_id)
    flushers = asyncio.create_task(writes.run())
    age = await writes.write(StageWrite(job_id, 0, started="load", attempt=1))
"""

from __future__ import annotations

from uuid import UUID

from worker.daemon.db import LockWaits
from worker.db.batcher import Batcher, Verdict
from worker.db.driver import Driver, Locked, StageWrite
from worker.db.errors import refused

# Statements in flight at once (each holds a pooled connection while it commits).
MAX_FLUSHES = 3


class StageWrites:
    """The stage writes of one worker's running jobs, on a `Batcher`."""

    def __init__(self, driver: Driver, worker_id: UUID) -> None:
        self._driver = driver
        self._worker_id = worker_id
        self._batcher: Batcher[StageWrite, float | None] = Batcher(
            self._write,
            judge=_judge,
            flushers=MAX_FLUSHES,
            locks=LockWaits("its stage is recorded, and the job goes on,"),
            job_of=_job_of,
            name="stage-writes",
        )

    async def run(self) -> None:
        """The flushers, until cancelled."""
        await self._batcher.run()

    async def write(self, write: StageWrite) -> float | None:
        """Commit `write` in the next shared statement. Returns the seconds since the started
        stage first started (0 if none starts), or None if this worker no longer holds the
        job (it was rescued after a lost heartbeat): then nothing was written."""
        return await self._batcher.run_one(write)

    async def _write(self, batch: list[StageWrite]) -> list[float | Locked | None]:
        return await self._driver.write_stages(self._worker_id, batch)


def _job_of(write: StageWrite) -> str:
    return write.job_id


def _judge(batch: list[StageWrite], exc: Exception, alone: bool) -> Verdict:
    # Each writer retries an outage under its own patience. A refused batch is written one
    # write at a time: one write refused must not fail the others; refused alone, it fails.
    if not refused(exc):
        return Verdict.FAIL
    return Verdict.SPLIT
