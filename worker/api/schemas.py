"""The shapes the HTTP edge accepts and returns; the OpenAPI spec is built from these.

A body's limits are the client's own (`worker.client`), so the API refuses what the client
would. What this does not do: it reads no request and runs no statement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from worker.client import (
    MAX_DELAY,
    MAX_RETRIES_LIMIT,
    RUN_AT_YEARS,
    Job,
    run_at_problem,
    text_problem,
)
from worker.encoding import NotStorable, dumps
from worker.models import JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE

# The bounds of what the columns hold, the client's own (`worker.client.validation`), checked
# here too so that a request is refused naming its field before anything reaches the database.
MAX_DELAY_SECONDS = MAX_DELAY.total_seconds()


def _storable_name(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _due_time(value: datetime) -> datetime:
    problem = run_at_problem(value)
    if problem is not None:
        raise ValueError(f"{problem} (UTC)")
    return value


Name = Annotated[str, AfterValidator(_storable_name)]


class EnqueueBody(BaseModel):
    """`POST /jobs`: the job to enqueue. Only `task` is required."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: Name = Field(min_length=1, max_length=MAX_TASK_NAME, examples=["send_email"])
    payload: dict[str, Any] = Field(default_factory=dict, examples=[{"to": "ada@example.com"}])
    queue: Name = Field(default="default", min_length=1, max_length=255)
    priority: int = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    delay: float = Field(
        default=0.0,
        ge=0,
        le=MAX_DELAY_SECONDS,
        allow_inf_nan=False,
        description="Seconds before the job may run (at most 100 years).",
    )
    run_at: Annotated[AwareDatetime, AfterValidator(_due_time)] | None = Field(
        default=None,
        description=(
            f"When the job may run (ISO 8601 with a time zone, years {RUN_AT_YEARS[0]} to "
            f"{RUN_AT_YEARS[1]})."
        ),
    )
    max_retries: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETRIES_LIMIT,
        description="Unset: the worker's WORKER_MAX_RETRIES applies.",
    )
    unique_key: Name | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="While a pending, processing or paused job holds this key, that job is "
        "returned (200, `duplicate` true) and nothing is inserted.",
    )
    concurrency_key: Name | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="Jobs sharing this key run at most their task's concurrency at once.",
    )


class ResumeBody(BaseModel):
    """`POST /jobs/{id}/resume`: the answer to the paused job's question (any JSON that
    `jsonb` stores, no larger than WORKER_MAX_PAYLOAD_BYTES encoded)."""

    model_config = ConfigDict(extra="forbid")

    answer: Any = None

    @field_validator("answer")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        try:
            text = dumps(value)
        except NotStorable as exc:
            raise ValueError(f"value {exc}") from None
        # Validated with the limit in the context; without one (e.g. building the spec) only
        # what `jsonb` refuses is checked.
        limit = (info.context or {}).get("max_bytes")
        size = len(text) if text.isascii() else len(text.encode())
        if limit is not None and size > limit:
            raise ValueError(
                f"is {size} bytes encoded; the limit is {limit} (WORKER_MAX_PAYLOAD_BYTES)"
            )
        return value


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
    unique_key: str | None = None
    concurrency_key: str | None = None
    stages: list[StageOut]
    outputs: dict[str, Any]
    duplicate: bool = Field(
        default=False, description="The enqueue found a live job holding its unique key."
    )

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
            unique_key=job.unique_key,
            concurrency_key=job.concurrency_key,
            stages=[StageOut(**s) for s in job.stages],
            outputs=job.outputs,
            duplicate=job.duplicate,
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


class QueueOut(BaseModel):
    """One queue: paused or not, its limits (null: none), its live jobs."""

    name: str
    paused: bool
    concurrency: int | None = Field(description="Jobs running at once, across all workers.")
    rate: float | None = Field(description="Jobs started per second, at most.")
    burst: float | None = Field(description="Jobs the rate lets start at once.")
    pending: int
    processing: int


class QueueList(BaseModel):
    queues: list[QueueOut]


class LimitBody(BaseModel):
    """`POST /queues/{name}/limit`: the queue's limits; one left out (or null) is lifted."""

    model_config = ConfigDict(extra="forbid", strict=True)

    concurrency: int | None = Field(default=None, ge=1, le=2**31 - 1)
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    burst: float | None = Field(default=None, ge=1, allow_inf_nan=False)


class Health(BaseModel):
    status: str
    database: str


class ErrorOut(BaseModel):
    """Every error answer: one line naming the problem (and, for a 422, each bad field)."""

    error: str
    detail: list[dict[str, Any]] | None = None
