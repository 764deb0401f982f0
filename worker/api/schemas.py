"""The shapes the HTTP edge accepts and returns; the OpenAPI spec is built from these."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from worker.client import Job
from worker.models import JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE


class EnqueueBody(BaseModel):
    """`POST /jobs`: the job to enqueue. Only `task` is required."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str = Field(min_length=1, max_length=MAX_TASK_NAME, examples=["send_email"])
    payload: dict[str, Any] = Field(default_factory=dict, examples=[{"to": "ada@example.com"}])
    queue: str = Field(default="default", min_length=1, max_length=255)
    priority: int = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    delay: float = Field(default=0.0, ge=0, description="Seconds before the job may run.")
    run_at: AwareDatetime | None = Field(
        default=None, description="When the job may run (ISO 8601 with a time zone)."
    )
    max_retries: int | None = Field(
        default=None, ge=0, description="Unset: the worker's WORKER_MAX_RETRIES applies."
    )


class ResumeBody(BaseModel):
    """`POST /jobs/{id}/resume`: the answer to the paused job's question (any JSON)."""

    model_config = ConfigDict(extra="forbid")

    answer: Any = None


class StageOut(BaseModel):
    stage: str
    kind: str
    status: str
    output: Any = None
    error: str | None = None
    attempt: int
    started_at: datetime | None = None
    finished_at: datetime | None = None


class JobOut(BaseModel):
    """A job with its stages and their outputs, as `GET /jobs/{id}` returns it."""

    id: str
    task: str
    queue: str
    status: JobStatus
    priority: int
    payload: dict[str, Any]
    result: Any = None
    error: str | None = None
    retry_count: int
    max_retries: int | None = None
    question: Any = None
    answer: Any = None
    cancel_requested: bool
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime | None = None
    stages: list[StageOut]
    outputs: dict[str, Any]

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.job_id,
            task=job.task,
            queue=job.queue,
            status=job.status,
            priority=job.priority,
            payload=job.payload,
            result=job.result,
            error=job.error,
            retry_count=job.retry_count,
            max_retries=job.max_retries,
            question=job.question,
            answer=job.answer,
            cancel_requested=job.cancel_requested,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            run_at=job.run_at,
            stages=[StageOut(**s) for s in job.stages],
            outputs=job.outputs,
        )


class JobSummary(BaseModel):
    """One row of `GET /jobs` (`error` is its first line only)."""

    id: str
    queue: str
    task: str
    status: JobStatus
    priority: int
    retry_count: int
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime


class JobPage(BaseModel):
    """A page of jobs, newest first; pass `next_cursor` as `cursor` for the next page."""

    jobs: list[JobSummary]
    next_cursor: str | None = None


class ActionOut(BaseModel):
    """The status right after an action (a running job's cancel is a request it honours at its
    next stage boundary: `cancel_requested` is true and `status` still `processing`)."""

    id: str
    status: JobStatus
    cancel_requested: bool = False


class QueueStats(BaseModel):
    queue: str
    counts: dict[str, int] = Field(description="Jobs per status (every status is listed).")
    oldest_pending_seconds: float | None = Field(
        description="How long the oldest due pending job has waited; null when none waits."
    )


class Stats(BaseModel):
    queues: list[QueueStats]
    totals: dict[str, int]


class Health(BaseModel):
    status: str
    database: str


class ErrorOut(BaseModel):
    """Every error answer: one line naming the problem (and, for a 422, each bad field)."""

    error: str
    detail: list[dict[str, Any]] | None = None
