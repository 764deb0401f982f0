"""Value types shared by every layer: job and stage statuses, and progress events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field


class JobStatus(StrEnum):
    """Where a job is in its life. Stored as text in `worker.jobs.status`.

    >>> JobStatus("completed").is_terminal
    True
    """

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    PAUSED = "paused"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


class StageStatus(StrEnum):
    """Where one stage (or cleanup) of a pipeline job is. Stored in `worker.job_stages.status`."""

    RUNNING = "running"
    WAITING = "waiting"  # a cleanup owed by an attempt, not started yet
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SNOOZED = "snoozed"
    PAUSED = "paused"


class StageKind(StrEnum):
    """What a stage row is: one of the pipeline's stages, or one of its `ALL_DONE` cleanups.
    Stored as text in `worker.job_stages.kind`."""

    STAGE = "stage"
    CLEANUP = "cleanup"


@dataclass
class StageRow:
    """A stage's persisted state (`worker.job_stages`), as `StageStore.load` reads it back."""

    stage: str
    kind: StageKind
    status: StageStatus
    output: Any
    error: str | None
    attempt: int

    def __post_init__(self) -> None:
        # Stores read text; the database's checks keep it to these values.
        self.kind = StageKind(self.kind)
        self.status = StageStatus(self.status)


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})

EventStatus = Literal[
    "started", "progress", "completed", "skipped", "paused", "failed", "cancelled"
]


class ProgressEvent(BaseModel):
    """One step of a job's progress, as published on the progress bus.

    `id` increases monotonically per bus, so a reader can resume after the last id it saw.
    """

    job_id: str
    step: str
    status: EventStatus
    message: dict[str, Any] | None = None
    id: int = 0
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
