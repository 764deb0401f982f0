"""A pipeline's stage rows in this process's memory: the `StageStore` of the in-memory driver
(`worker.db.memory`) and of `worker.stages.MemoryRuntime`.

`MemoryStageStore` keeps the rules the daemon's store keeps on PostgreSQL (a snoozed stage
keeps its first start, a start records the cleanups after it as waiting, a completed stage's
output is stored as JSON), once, for both. What it does not do: hold writes to the attempt that
holds the job (the driver checks that), or keep anything once the process ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker.models import JSON, ClaimedJob, Outcome, StageHistory, StageKind, StageRow, StageStatus

# Cleanup rows of an attempt that did not finish its cleanups: one ran, or had yet to run.
UNFINISHED = frozenset({StageStatus.RUNNING, StageStatus.WAITING})


@dataclass
class _Stored:
    row: StageRow
    started_at: float


class MemoryStageStore:
    """A `StageStore` in this process's memory; `final_errors` holds `failed_for_good`'s.

    Outputs are written as the JSON text the runner encoded, and read back decoded."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._jobs: dict[str, dict[str, _Stored]] = {}
        self._clock = clock
        self.final_errors: dict[str, str] = {}

    def rows(self, job_id: str) -> dict[str, StageRow]:
        """A job's stage rows by stage name, as they are now (copies)."""
        return {name: _copy(s.row) for name, s in self._jobs.get(job_id, {}).items()}

    async def load(self, job_id: str) -> StageHistory:
        # In the order they ran, cleanups not run yet last, as `sql.LOAD_STAGES` reads them.
        stored = sorted(
            self._jobs.get(job_id, {}).values(),
            key=lambda s: (s.row.status == StageStatus.WAITING, s.started_at, s.row.stage),
        )
        rows = [_copy(s.row) for s in stored]
        return StageHistory(rows, _owed_cleanup(rows))

    async def started(
        self, job: ClaimedJob, stage: str, kind: str, attempt: int, waiting: Sequence[str] = ()
    ) -> float:
        return self.start_stage(job.id, stage, kind, attempt, waiting)

    async def finished(
        self,
        job: ClaimedJob,
        stage: str,
        status: str,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        self.end_stage(job.id, stage, status, output, error)

    async def advance(
        self,
        job: ClaimedJob,
        done: str,
        output: str | None,
        stage: str,
        kind: str,
        attempt: int,
        waiting: Sequence[str] = (),
    ) -> float:
        self.end_stage(job.id, done, StageStatus.COMPLETED, output, None)
        return self.start_stage(job.id, stage, kind, attempt, waiting)

    async def failed_for_good(self, job: ClaimedJob, error: str) -> None:
        self.final_errors[job.id] = error

    def claim_started(self, job: ClaimedJob, stage: str) -> None:
        """Record `stage` running for the job's attempt, as a claim does for a pipeline job's
        first run (then claimed with `first_stage_started=True`)."""
        self.start_stage(job.id, stage, StageKind.STAGE, job.attempt, ())

    def record_outcome(self, job: ClaimedJob, outcome: Outcome) -> None:
        """Write the stage end the outcome carries, as the job's outcome write does."""
        end = outcome.stage_end
        if end is not None:
            error = None if end.status == StageStatus.COMPLETED else outcome.error
            self.end_stage(job.id, end.stage, end.status, end.output, error)

    def forget(self, job_id: str) -> None:
        """Drop a job's stage rows, as deleting the job does."""
        self._jobs.pop(job_id, None)

    def start_stage(
        self, job_id: str, stage: str, kind: str, attempt: int, waiting: Sequence[str]
    ) -> float:
        """Record `stage` running (and `waiting` owed after it); its age in seconds."""
        rows, now = self._jobs.setdefault(job_id, {}), self._clock()
        before = rows.get(stage)
        # A snoozed stage keeps its first start: its deadline counts from when it first ran.
        snoozed = before is not None and before.row.status == StageStatus.SNOOZED
        started_at = before.started_at if before is not None and snoozed else now
        running = StageRow(stage, StageKind(kind), StageStatus.RUNNING, None, None, attempt)
        rows[stage] = _Stored(running, started_at)
        for name in waiting:  # the cleanups not run yet are known to be owed
            row = StageRow(name, StageKind.CLEANUP, StageStatus.WAITING, None, None, attempt)
            rows[name] = _Stored(row, now)
        return now - started_at

    def end_stage(
        self, job_id: str, stage: str, status: str, output: JSON, error: str | None
    ) -> None:
        """Record how `stage` ended; `output` is the JSON text of a completed one."""
        stored = self._jobs.get(job_id, {}).get(stage)
        if stored is None:
            return  # as the database's update of a row that is not there
        row = stored.row
        row.status = StageStatus(status)
        completed = row.status == StageStatus.COMPLETED
        # Outputs come as JSON text, and are read back as the value it encodes.
        row.output = json.loads(output) if completed and output is not None else None
        row.error = error


def _copy(row: StageRow) -> StageRow:
    return StageRow(row.stage, row.kind, row.status, row.output, row.error, row.attempt)


def _owed_cleanup(rows: Sequence[StageRow]) -> int | None:
    """`worker.owed_cleanup_attempt` over rows in memory: the latest attempt with a stage newer
    than the oldest finished cleanup (a running or waiting cleanup counts as never finished)."""
    cleanups = [r for r in rows if r.kind == StageKind.CLEANUP]
    cleaned = min((0 if r.status in UNFINISHED else r.attempt for r in cleanups), default=0)
    dirty = [r.attempt for r in rows if r.kind == StageKind.STAGE and r.attempt > cleaned]
    return max(dirty, default=None)
