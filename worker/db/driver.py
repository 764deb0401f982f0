"""The driver seam: every operation the daemon and the progress bus perform on the database.

The daemon's parts (the local queue, the batchers, the plugins) and the events bus talk to a
`Driver`, never to a pool or a statement. `worker.db.postgres.PostgresDriver` runs the
statements of `worker.db.sql` over psycopg pools; `worker.db.memory.MemoryDriver` keeps the
same guarantees in plain Python (a job claimed once, outcomes and stage writes only for the
attempt that holds the job), for running the core without PostgreSQL.

Each operation returns typed rows. Writes that are batched answer one entry per item, in the
items' order: the item's answer, `LOCKED` when another client holds the job's row locked (it
is still ours: try again later), or None when the job is no longer this worker's attempt's
(it was rescued): nothing was written for it.

What this does not do: it does not retry, nor decide what an outage means (see the daemon's
`Patience`): a driver raises the transient errors its database raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol
from uuid import UUID

from worker.models import (
    ClaimedJob,
    JobStatus,
    Outcome,
    ProgressEvent,
    StageHistory,
    StageKind,
    StageStatus,
)


class Locked:
    """The job's row is locked by another client: its write was skipped, to be tried again."""

    def __repr__(self) -> str:
        return "LOCKED"


LOCKED: Final = Locked()


class UnreadableJSON:
    """Stands in for a JSON value this process cannot decode (nested too deeply for Python).

    PostgreSQL accepts JSON nested thousands of levels deep; Python's decoder stops near its
    recursion limit (about 1000). A job carrying such a value fails with a clear error instead
    of taking the claim of every other job down with it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableJSON({self.reason!r})"


@dataclass(frozen=True, slots=True)
class Registration:
    """A worker as `worker.workers` records it."""

    id: UUID
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    tasks: list[str]  # the tasks it serves: its claims take no other
    lease_seconds: float  # how long its heartbeat may be silent before it counts as dead
    # The key of the lock its claim session holds while the worker lives (`Driver.liveness_key`).
    liveness_key: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """What every claim of one worker asks, made once: its queues and the tasks it registered
    (it claims no other), its default retries and those of the tasks that set their own, and
    the registered pipelines with their first stages (the claim starts those)."""

    worker_id: UUID
    queues: list[str]
    tasks: list[str]
    default_max_retries: int
    pipelines: list[str]
    first_stages: list[str]
    retry_tasks: list[str] = field(default_factory=list)  # tasks with their own max_retries
    retry_limits: list[int] = field(default_factory=list)  # and those max_retries
    key_tasks: list[str] = field(default_factory=list)  # tasks with a `concurrency` per key
    key_limits: list[int] = field(default_factory=list)  # and that concurrency


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The worker's backoff, for a retry whose task chose no delay of its own."""

    backoff_base: float  # seconds before the first retry; doubling with each one after
    backoff_max: float  # the longest wait, whatever the count


@dataclass(slots=True)
class OutcomeWrite:
    """The outcome of the attempt that claimed the job with `retries`, and may retry it while
    fewer than `max_retries` (as the claim read them) were made."""

    job_id: str
    retries: int
    outcome: Outcome
    max_retries: int


@dataclass(frozen=True, slots=True)
class RecordedOutcome:
    """A job's status as its outcome write left it (`pending` again for a retry or snooze)."""

    id: str
    status: JobStatus
    task: str
    queue: str
    retry_count: int
    duration: float | None  # seconds since the attempt started
    # The attempt's error as written (set by the completer, which has it at hand): the log
    # line of a retry or a failure names it.
    error: str | None = None


@dataclass
class StageWrite:
    """End the stage `ended` with `status` (and `output`, JSON text, or `error`), start the
    stage `started` (of `kind`, in `attempt`, with the cleanups `waiting` after it), or both at
    once; for the job as claimed with `retries` (the write applies only while that attempt
    holds it)."""

    job_id: str
    retries: int
    ended: str | None = None
    status: StageStatus = StageStatus.COMPLETED
    output: str | None = None
    error: str | None = None
    started: str | None = None
    kind: StageKind = StageKind.STAGE
    attempt: int = 0
    waiting: tuple[str, ...] = ()  # cleanups to run after `started`, recorded as waiting


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat found: whether the worker had to register again (it was presumed
    dead), and the jobs it holds whose cancel was requested."""

    registered_again: bool
    cancel_requested: list[str]


@dataclass(frozen=True, slots=True)
class RescuedJob:
    """A job taken back from a worker silent for a whole lease."""

    id: str
    task: str
    queue: str


@dataclass(slots=True)
class EventWrite:
    """One progress event to store; `message` is JSON text, fixed when it was published."""

    job_id: str
    step: str
    status: str
    message: str | None
    created_at: datetime


# Each pipeline's stages and its cleanups (`ALL_DONE` stages), by task, in the order they run.
StagePlans = Mapping[str, tuple[list[str], list[str]]]


class Closable(Protocol):
    """A subscription: `close` it to stop hearing."""

    def close(self) -> None: ...


class Driver(Protocol):
    """The database as the daemon and the progress bus use it."""

    # The key of the lock a session of this driver holds for as long as the process lives, so
    # that the server's end of those sessions tells rescuers it died; None where no session
    # lasts (behind a transaction pooler, in memory): there only the lease tells.
    liveness_key: int | None

    async def open(self) -> None:
        """Start connecting (without waiting for the database)."""

    async def close(self) -> None: ...

    async def confirm_reachable(self) -> None:
        """Prove the database is back on a new session, and replace sessions from before."""

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> Closable:
        """Call `callback(payload)` on the caller's event loop for each notification on
        `channel` (`worker_jobs`: a queue with news; `worker_cancel`: a job id), and
        `callback(None)` whenever some may have been missed."""

    # -- liveness ---------------------------------------------------------------------------

    async def register_worker(self, registration: Registration) -> None: ...

    async def heartbeat(
        self,
        registration: Registration,
        registered_again: Callable[[], None] | None = None,
        cancels: bool = True,
    ) -> Beat:
        """Renew the worker's lease (registering it again if its row is gone, and then calling
        `registered_again` at once, before anything else the beat does can fail), and, if
        `cancels`, read the cancel requests of the jobs it holds."""

    async def deregister_worker(self, worker_id: UUID) -> None: ...

    async def rescue(
        self, lease: float, grace: float, still_sure: Callable[[], bool], starting: bool = False
    ) -> list[RescuedJob]:
        """Take back the jobs of dead workers (`sql.RESCUE`): silent for `lease` seconds, or
        whose sessions ended and who have not beaten for `grace` seconds since that was seen,
        if `still_sure()` holds once a connection is in hand. `starting`: the caller has just
        started, and sees late the sessions of workers that died before it."""

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, spec: ClaimSpec, limit: int, running: list[str]) -> list[ClaimedJob]:
        """Up to `limit` due jobs, now this worker's; never one in `running`."""

    async def release(self, worker_id: UUID, ids: list[str]) -> None:
        """Hand jobs back to the queue without counting an attempt."""

    async def held_jobs(self, worker_id: UUID) -> set[str]:
        """The jobs the database shows as this worker's."""

    # -- outcomes and stages ----------------------------------------------------------------

    async def record_outcomes(
        self, worker_id: UUID, policy: RetryPolicy, batch: Sequence[OutcomeWrite]
    ) -> list[RecordedOutcome | Locked | None]: ...

    async def write_stages(
        self, worker_id: UUID, batch: Sequence[StageWrite]
    ) -> list[float | Locked | None]:
        """Each write's answer: the seconds since its started stage first started (0 if it
        starts none)."""

    async def load_stages(self, job_id: str) -> StageHistory: ...

    async def record_final_error(
        self, worker_id: UUID, job_id: str, retries: int, error: str
    ) -> bool:
        """Record that the attempt failed for good; False if the job is no longer its."""

    # -- housekeeping -----------------------------------------------------------------------

    async def prune(self, statuses: list[str], before: datetime, batch: int) -> int:
        """Delete up to `batch` jobs finished before `before`; returns how many."""

    # -- periodic tasks ---------------------------------------------------------------------

    async def fire_tick(
        self, key: str, task: str, spec: str, tick: datetime, queue: str
    ) -> str | None:
        """Enqueue the job of schedule `key`'s `tick`, in `queue`, unless its row has a tick
        as late: the new job's id, or None (another worker fired it, or the schedule is new:
        its row is created at `tick`, with no job)."""

    async def publish_stage_plans(self, plans: StagePlans) -> None:
        """Record each pipeline's stages and cleanups, for the console."""

    async def publish_task_limits(self, limits: Mapping[str, int]) -> None:
        """Record the retry limit each task's jobs get when they set none, for `worker show`."""

    async def roll_up(self) -> bool:
        """Count the recent outcomes and sample each queue's depth for the console's charts;
        False if another worker has this turn."""

    # -- progress events --------------------------------------------------------------------

    async def publish_events(self, batch: Sequence[EventWrite]) -> list[str]:
        """Store the events; returns the jobs whose events were left out: they are gone."""

    async def read_events(self, job_id: str, after: int, limit: int) -> list[ProgressEvent]: ...
