"""The shapes the HTTP edge accepts and returns; the OpenAPI spec is built from these.

A body's limits are the client's own (`worker.client`), so the API refuses what the client
would. What this does not do: it reads no request and runs no statement.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
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
from worker.db.console import BulkVerb, ConsoleJobRow, ConsoleWorkerRow, Tab
from worker.encoding import NotStorable, dumps
from worker.models import JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE

# The bounds of what the columns hold, the client's own (`worker.client.validation`), checked
# here too so that a request is refused naming its field before anything reaches the database.
MAX_DELAY_SECONDS = MAX_DELAY.total_seconds()
# What the spec says of every text the database stores: no NUL (PostgreSQL text holds none).
NO_NUL = "^[^\u0000]*$"
# Any JSON value `jsonb` stores, declared once in the spec's components: `openapi.py` turns
# each `STORABLE` mark into a reference to it (pydantic resolves a `$ref` of its own at once).
STORABLE_REF = "#/components/schemas/StorableJson"
STORABLE: dict[str, Any] = {"x-storable-json": True}
STORABLE_JSON: dict[str, Any] = {
    "description": "Any JSON value whose strings and keys hold no NUL (jsonb stores none).",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": STORABLE_REF}},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"$ref": STORABLE_REF},
        },
    ],
}
# The least rate the client takes (`worker.client.queues.limit_params`): a job per 11 days.
RATE_LEAST = 1e-6
# The years a due time may fall in (`RUN_AT_YEARS`, 2 to 9998), as a pattern for the spec.
_RUN_AT_PATTERN = (
    "^(000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-"
)


def _integral(cls: type[BaseModel], value: Any) -> Any:
    """JSON does not tell 3 from 3.0, and JSON Schema counts both as integers; so do we."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


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


Name = Annotated[str, AfterValidator(_storable_name), Field(json_schema_extra={"pattern": NO_NUL})]
StorableObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": STORABLE,
        }
    ),
]


class EnqueueBody(BaseModel):
    """`POST /jobs`: the job to enqueue. Only `task` is required."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: Name = Field(min_length=1, max_length=MAX_TASK_NAME, examples=["send_email"])
    payload: StorableObject = Field(default_factory=dict, examples=[{"to": "ada@example.com"}])
    queue: Name = Field(default="default", min_length=1, max_length=255)
    priority: int = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    delay: float = Field(
        default=0.0,
        ge=0,
        le=MAX_DELAY_SECONDS,
        allow_inf_nan=False,
        description="Seconds before the job may run (at most 100 years).",
    )
    run_at: (
        Annotated[
            AwareDatetime,
            AfterValidator(_due_time),
            Field(json_schema_extra={"pattern": _RUN_AT_PATTERN}),
        ]
        | None
    ) = Field(
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

    _integral = field_validator("priority", "max_retries", mode="before")(_integral)


class ResumeBody(BaseModel):
    """`POST /jobs/{id}/resume`: the answer to the paused job's question (any JSON that
    `jsonb` stores, no larger than WORKER_MAX_PAYLOAD_BYTES encoded)."""

    model_config = ConfigDict(extra="forbid")

    answer: Annotated[Any, WithJsonSchema(STORABLE)] = None

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

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # A burst is how many jobs the rate lets start at once: it needs a rate.
        json_schema_extra={
            "if": {"required": ["burst"], "properties": {"burst": {"type": "number"}}},
            "then": {"required": ["rate"], "properties": {"rate": {"type": "number"}}},
        },
    )

    concurrency: int | None = Field(default=None, ge=1, le=2**31 - 1)
    rate: float | None = Field(default=None, ge=RATE_LEAST, allow_inf_nan=False)
    burst: float | None = Field(default=None, ge=1, allow_inf_nan=False)

    _integral = field_validator("concurrency", mode="before")(_integral)


class Health(BaseModel):
    status: str
    database: str


class ErrorOut(BaseModel):
    """Every error answer: one line naming the problem (and, for a 422, each bad field)."""

    error: str
    detail: list[dict[str, Any]] | None = None


class StreamEnd(BaseModel):
    """The `end` event closing a job's stream: its final status (null: the job was deleted)."""

    job_id: str
    status: JobStatus | None


# -- the console's (`worker.api.console`) --------------------------------------------------

# Jobs a bulk verb changes in one request at most; the answer says when more are left.
BULK_MAX = 10_000
# A `since` starts with its year: pydantic alone would also take seconds since 1970 as a time.
TIME_PATTERN = "^[0-9]{4}-"


def _dated(value: Any) -> Any:
    if not isinstance(value, str) or re.match(TIME_PATTERN, value) is None:
        raise ValueError("an ISO 8601 time with a time zone, e.g. 2026-12-02T12:00Z")
    return value


# Lax: the text reaches the datetime as a Python str (after `_dated`), which strict refuses.
Since = Annotated[
    AwareDatetime,
    BeforeValidator(_dated),
    Field(strict=False, json_schema_extra={"pattern": TIME_PATTERN}),
]


class Window(enum.StrEnum):
    """A chart's span: an hour by the minute, or a day by ten minutes."""

    HOUR = "hour"
    DAY = "day"


class ConsolePage(BaseModel):
    """`GET /console/jobs`: a page of a tab, the count of each tab, the server's time."""

    jobs: list[ConsoleJobRow]
    next_cursor: str | None
    counts: dict[str, int] = Field(description="Jobs per counted tab, under the same search.")
    now: datetime


class HolderOut(BaseModel):
    id: str
    hostname: str | None
    pid: int | None
    heartbeat_age: float | None


class JobViewOut(BaseModel):
    """`GET /console/jobs/{id}`: who holds the job, and its task's stages if a worker said."""

    worker: HolderOut | None
    stages: list[str] | None
    cleanups: list[str] | None
    retry_limit: int | None = Field(
        default=None,
        description="Retries the job may make: its own limit, else its task's as the workers "
        "published it; null if no worker of its task has started.",
    )
    now: datetime


class FilterBody(BaseModel):
    """The jobs a bulk verb is over, as the list's query parameters name them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tab: Tab = Tab.ALL
    q: Name | None = Field(default=None, max_length=200)
    queue: Name | None = Field(default=None, max_length=255)
    task: Name | None = Field(default=None, max_length=255)
    since: Since | None = None


class BulkBody(BaseModel):
    """`POST /console/bulk`: the verb, its filter, and the count the operator confirmed."""

    model_config = ConfigDict(extra="forbid", strict=True)

    verb: BulkVerb
    filter: FilterBody = Field(default_factory=FilterBody)
    expected: int = Field(ge=0, le=BULK_MAX)

    _integral = field_validator("expected", mode="before")(_integral)


class BulkCount(BaseModel):
    verb: BulkVerb
    jobs: int


class BulkOut(BaseModel):
    """What a bulk verb did: jobs changed, jobs left as they were (another changed them
    first, or a unique key held them back), and whether the filter still matches more."""

    verb: BulkVerb
    changed: int
    unchanged: int
    more: bool


class WorkerList(BaseModel):
    """`GET /console/workers`: each worker with the jobs it holds (`id`, `task`, `queue`,
    `started_at`), and the lease its heartbeat is judged by."""

    workers: list[ConsoleWorkerRow]
    lease_seconds: float
    now: datetime


class UnservedTaskOut(BaseModel):
    """Pending jobs of one task in one queue that no live worker of the queue registered."""

    queue: str
    task: str
    jobs: int
    oldest_created_at: datetime
    queue_workers: int = Field(
        description="Live workers of the queue, all serving other tasks; 0: none runs it."
    )


class UnservedList(BaseModel):
    """`GET /console/unserved`: the pending jobs no live worker of their queue can run, per
    queue and task, most jobs first (`worker.unserved_tasks`); they wait for a worker that
    registered their task."""

    tasks: list[UnservedTaskOut]
    now: datetime


class OutcomePoint(BaseModel):
    bucket: datetime
    completed: int
    failed: int


class DepthPoint(BaseModel):
    """A queue's deepest minute in a bucket; None when no worker sampled it then."""

    bucket: datetime
    pending: int | None
    processing: int | None


class ChartOut(BaseModel):
    """`GET /console/charts`: every bucket of the window, oldest first, zeros included."""

    window: Window
    bucket_seconds: int
    outcomes: list[OutcomePoint]
    depth: dict[str, list[DepthPoint]]
