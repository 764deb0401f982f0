"""Value types shared by every layer: statuses, stage rows, progress events, and what one
attempt at a job starts from (`ClaimedJob`) and ends with (`Outcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

JSON = Any  # a value JSON can hold


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
    # Waiting for parent jobs of its workflow to end; no claim reads it (migration 0014).
    HELD = "held"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


class ParentFailure(StrEnum):
    """What a parent that failed for good, was cancelled or was deleted does to its child.
    Stored as text in `worker.jobs.on_parent_failure`."""

    CANCEL = "cancel"  # the child is cancelled, its error naming the parent
    RUN = "run"  # the child runs anyway once every parent has ended (a finalizer)
    # The child waits for every parent, then runs only if one of them did not complete; if all
    # completed it is cancelled as not needed (a batch's `on_failure`, migration 0016).
    RUN_IF_FAILED = "run_if_failed"


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


@dataclass
class StageHistory:
    """A job's stage rows as a resuming worker reads them (`StageStore.load`), in the order
    they ran, and the attempt whose `ALL_DONE` cleanups are owed, if one is: it ran a stage
    but did not finish every cleanup (`worker.owed_cleanup_attempt` in SQL)."""

    rows: list[StageRow]
    owed_cleanup: int | None


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


class OutcomeKind(StrEnum):
    """How an attempt ended, as `sql.RECORD_OUTCOMES` maps it onto the job's status."""

    COMPLETED = "completed"
    RETRY = "retry"  # pending after a backoff while retries remain, else failed
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    SNOOZED = "snoozed"  # pending again after a delay, not counted as a retry
    WAITING = "waiting"  # held until the children it spawned have ended (migration 0017)


class JobEnding(StrEnum):
    """What becomes of a pipeline's job after the attempt its cleanups (`ALL_DONE` stages)
    run for, as known when they start: `ctx.ending`. A cleanup keeps what a retry needs."""

    RETRY = "retry"  # another attempt follows
    FAILED = "failed"  # no attempt follows: the job fails for good
    COMPLETED = "completed"
    CANCELLED = "cancelled"


@dataclass
class ClaimedJob:
    """A job as the claim returned it."""

    id: str
    task: str
    payload: dict[str, JSON]
    queue: str
    priority: int
    retry_count: int
    max_retries: int
    cancel_requested: bool
    answer: JSON
    last_error: str | None
    # An earlier claim of this attempt failed for good, then was lost in its cleanups.
    final_error: str | None
    # The trace the job was enqueued in, as `worker.tracing` stores it (None: none).
    trace_context: dict[str, str] | None = None
    # The workflow the job belongs to (None: none), and its parents as
    # `worker.parent_results` gives them (migration 0014).
    workflow_id: Any = None
    # The claim recorded the first stage of this pipeline job as running: its first run, so
    # it has no other stage rows (see `sql.CLAIM`).
    first_stage_started: bool = False
    parents: list[dict[str, JSON]] | None = None

    @property
    def attempt(self) -> int:
        return self.retry_count + 1


@dataclass
class Outcome:
    """How an attempt ended, as the completer writes it (see `sql.RECORD_OUTCOMES`)."""

    kind: OutcomeKind
    result: JSON = None
    # `result` as the JSON text stored, when the runner has encoded it already.
    result_json: str | None = None
    error: str | None = None
    # Seconds until the job runs again: a snooze's, or a retry's chosen by its task (None: the
    # worker's backoff).
    delay: float | None = None
    # A pipeline stage that ended with the attempt, recorded with the outcome (one commit).
    stage_end: StageEnd | None = None
    # Progress events that report this outcome: published once it is written, never before.
    events: list[ProgressEvent] = field(default_factory=list)
    # What the job's code raised, for a failed attempt: what middleware's `on_error` is told.
    exception: BaseException | None = field(default=None, repr=False, compare=False)


@dataclass
class StageEnd:
    """How a pipeline stage ended, when that is written with its job's outcome."""

    stage: str
    status: StageStatus  # completed, or failed or cancelled (then the job's error)
    output: str | None = None  # JSON text, for a completed stage


@dataclass(frozen=True)
class ParentCounts:
    """How a job's parents ended, counted (`ctx.parent_counts`): a batch callback's summary.

    >>> ParentCounts(completed=98, failed=1, cancelled=1).total
    100
    """

    completed: int = 0
    failed: int = 0  # failed for good, retries spent
    cancelled: int = 0
    deleted: int = 0  # deleted before it ended

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled + self.deleted


@dataclass(frozen=True)
class ParentResult:
    """A parent of a workflow's job, as the job's claim read it: `ctx.parents`; or a child
    the job spawned, which it waits on as on a parent: `ctx.children`."""

    node: str | None  # its name in the workflow (None: outside it, or its row deleted)
    job_id: str
    task: str | None  # None once the parent's row was deleted
    status: str  # completed, failed or cancelled; `deleted` once its row is gone
    result: JSON = None  # its result, if it completed
    key: str | None = None  # a spawned child's key (None: a parent)

    @classmethod
    def read(cls, row: dict[str, JSON]) -> ParentResult:
        """One entry of `worker.parent_results`, as the claim read it."""
        node, task, key = row.get("node"), row.get("task"), row.get("key")
        return cls(node, str(row["id"]), task, row["status"], row.get("result"), key)
