"""Where a pipeline's stage state lives: the `StageRow` read back, the `StageStore` written.

The runner reads a job's rows once per claim and writes each stage's start and end through the
store; the daemon implements it on PostgreSQL (`worker.job_stages`), `MemoryStageStore` in a
dict. What it does not do: decide anything. Which stage runs next, and what an end means for
the job, is the runner's (`worker.stages.runner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from worker.models import JSON, ClaimedJob, StageHistory, StageStatus

# Stage rows still open: a stage that was running, snoozing or waiting for an answer.
OPEN = frozenset({StageStatus.RUNNING, StageStatus.SNOOZED, StageStatus.PAUSED})


class StageStore(Protocol):
    """Where stage state lives; the daemon implements it on PostgreSQL.

    `kind` is a `StageKind` and `status` a `StageStatus`; both are typed `str` because they
    are stored as text, and the members compare equal to it.
    """

    async def load(self, job_id: str) -> StageHistory: ...

    # The writes take the claimed job: they apply only while its attempt still holds it.

    async def started(
        self, job: ClaimedJob, stage: str, kind: str, attempt: int, waiting: Sequence[str] = ()
    ) -> float:
        """Record the stage as running, and the cleanups `waiting` after it as waiting; return
        seconds since it first started (snoozes kept)."""

    async def finished(
        self,
        job: ClaimedJob,
        stage: str,
        status: str,
        output: JSON = None,
        error: str | None = None,
    ) -> None: ...

    async def advance(
        self,
        job: ClaimedJob,
        done: str,
        output: JSON,
        stage: str,
        kind: str,
        attempt: int,
        waiting: Sequence[str] = (),
    ) -> float:
        """Record `done` completed with `output` and `stage` running (and `waiting` as
        `started` does), in one committed write; return as `started` does. `NotStorable` if
        the database refuses `output`."""

    async def failed_for_good(self, job: ClaimedJob, error: str) -> None:
        """Record that this attempt failed for good, before its cleanups run: should they be
        cut off, the next claim fails the job with `error` (see `settled_before_start`)."""
