"""An in-memory driver: the daemon's core against plain Python, with no database.

`MemoryDriver` implements `worker.db.driver.Driver` with dicts and keeps the guarantees of the
PostgreSQL statements (one claimer per job, outcomes and stage writes only from the attempt
holding the job, locked rows skipped, rescues of silent workers, each schedule tick once). It
is a seam for one-process workers and fast tests, not a mock: it speaks no SQL, and refuses
with `Unsupported` what it does not do (queue limits, concurrency keys).
`tests/support/conformance.py` runs one suite against it and `PostgresDriver`, the reference.

Notifications are delivered on the subscriber's loop: `enqueue` and `cancel` are meant to be
called from it. `unreachable = True` makes every operation fail as an outage does (`OSError`),
until it is set back.

    driver = MemoryDriver()
    job_id = driver.enqueue("send_email", {"to": "a@example.com"})
    worker = Worker("memory://", settings, driver=driver, bus=MemoryBus())
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from uuid import UUID

from worker.db.driver import LOCKED, Beat, Locked, RecordedOutcome, RescuedJob
from worker.db.errors import Unsupported
from worker.db.memory_stages import MemoryStageStore
from worker.models import (
    ClaimedJob,
    JobStatus,
    OutcomeKind,
    ProgressEvent,
    StageHistory,
    StageKind,
    StageStatus,
)

if TYPE_CHECKING:
    from worker.db.driver import (
        ClaimSpec,
        EventWrite,
        OutcomeWrite,
        Registration,
        RetryPolicy,
        StagePlans,
        StageWrite,
    )


class _Write(Protocol):
    job_id: str
    retries: int


W = TypeVar("W", bound=_Write)
A = TypeVar("A")


@dataclass
class MemoryJob:
    """A job as the memory driver keeps it."""

    id: str
    task: str
    payload: dict[str, Any]
    queue: str = "default"
    priority: int = 0
    run_at: float = 0.0  # `time.monotonic()` from when it is due
    status: JobStatus = JobStatus.PENDING
    worker_id: UUID | None = None
    retry_count: int = 0
    max_retries: int | None = None
    cancel_requested: bool = False
    answer: Any = None
    error: str | None = None
    final_error: str | None = None
    result: Any = None
    question: Any = None
    started_at: float | None = None
    finished_at: datetime | None = None
    seq: int = 0  # insertion order, for ties


@dataclass
class _Worker:
    registration: Registration
    heartbeat_at: float = field(default_factory=time.monotonic)


class _Subscription:
    def __init__(self, close: Callable[[], None]) -> None:
        self._close: Callable[[], None] | None = close

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


class MemoryDriver:
    """`worker.db.driver.Driver` in plain Python; see the module's docs."""

    liveness_key: int | None = None  # no sessions: only the lease judges a worker dead

    def __init__(self) -> None:
        self.jobs: dict[str, MemoryJob] = {}
        self.workers: dict[UUID, _Worker] = {}
        self.stages = MemoryStageStore()  # the rules of a stage's row, kept once
        self.events: list[ProgressEvent] = []
        self.locked: set[str] = set()  # rows another client holds locked
        self.paused_queues: set[str] = set()
        self.schedules: dict[str, datetime] = {}  # a schedule's key: its latest tick taken
        self.stage_plans: StagePlans = {}
        self.task_limits: dict[str, int] = {}
        self.rollups = 0  # rollups taken: the memory driver keeps no charts, only their count
        self.unreachable = False
        self.claims = 0  # claim statements answered, for tests of the claim loop
        self._subscribers: list[tuple[str, Callable[[str | None], None]]] = []
        self._seq = itertools.count(1)
        self._event_ids = itertools.count(1)

    # -- for users and tests ----------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float = 0.0,
        max_retries: int | None = None,
        concurrency_key: str | None = None,
    ) -> str:
        """Add a pending job; returns its id. A `concurrency_key` is refused (`Unsupported`):
        this driver would run the key's jobs side by side."""
        if concurrency_key is not None:
            raise Unsupported(
                "the in-memory driver does not apply concurrency keys: "
                f"concurrency_key={concurrency_key!r} needs PostgreSQL"
            )
        job_id = str(uuid.uuid4())
        self.jobs[job_id] = MemoryJob(
            job_id,
            task,
            payload or {},
            queue=queue,
            priority=priority,
            run_at=time.monotonic() + delay,
            max_retries=max_retries,
            seq=next(self._seq),
        )
        self._notify("worker_jobs", queue)
        return job_id

    def cancel(self, job_id: str) -> None:
        """Ask for the job to be cancelled (the daemon hears it at its next look)."""
        job = self.jobs[job_id]
        if job.status in (JobStatus.PENDING, JobStatus.PAUSED):
            job.status, job.finished_at = JobStatus.CANCELLED, datetime.now(UTC)
            job.cancel_requested = True
        elif job.status == JobStatus.PROCESSING:
            job.cancel_requested = True
            self._notify("worker_cancel", job_id)

    def pause_queue(self, queue: str) -> None:
        """Claims take nothing more from `queue` (running jobs go on), as `worker queue pause`."""
        self.paused_queues.add(queue)

    def resume_queue(self, queue: str) -> None:
        if queue in self.paused_queues:
            self.paused_queues.discard(queue)
            self._notify("worker_jobs", queue)

    def limit_queue(
        self, queue: str, *, concurrency: int | None = None, rate: float | None = None
    ) -> None:
        """Refused (`Unsupported`): this driver keeps no concurrency or rate limit of a queue."""
        raise Unsupported(
            f"the in-memory driver does not apply queue limits: queue {queue!r} "
            "(concurrency, rate) needs PostgreSQL"
        )

    def _reachable(self) -> None:
        if self.unreachable:
            raise OSError("the database is unreachable")

    def _holds(self, worker_id: UUID, job_id: str, retries: int) -> bool:
        """The outcome guard: the attempt that claimed the job with `retries` still holds it."""
        job = self.jobs.get(job_id)
        return (
            job is not None
            and job.status == JobStatus.PROCESSING
            and job.worker_id == worker_id
            and job.retry_count == retries
        )

    def _notify(self, channel: str, payload: str) -> None:
        for listening, callback in list(self._subscribers):
            if listening == channel:
                callback(payload)

    # -- the driver -------------------------------------------------------------------------

    async def open(self) -> None:
        self._reachable()

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> _Subscription:
        entry = (channel, callback)
        self._subscribers.append(entry)
        asyncio.get_running_loop().call_soon(callback, None)  # look once, as after a LISTEN
        return _Subscription(lambda: self._subscribers.remove(entry))

    async def close(self) -> None:
        return None

    async def confirm_reachable(self) -> None:
        self._reachable()

    async def register_worker(self, registration: Registration) -> None:
        self._reachable()
        self.workers[registration.id] = _Worker(registration)

    async def heartbeat(
        self,
        registration: Registration,
        registered_again: Callable[[], None] | None = None,
        cancels: bool = True,
    ) -> Beat:
        self._reachable()
        known = self.workers.get(registration.id)
        if known is None:
            self.workers[registration.id] = _Worker(registration)
            if registered_again is not None:
                registered_again()
        else:
            known.heartbeat_at = time.monotonic()
        requested = [
            j.id
            for j in self.jobs.values()
            if cancels
            and j.status == JobStatus.PROCESSING
            and j.worker_id == registration.id
            and j.cancel_requested
        ]
        return Beat(known is None, requested)

    async def deregister_worker(self, worker_id: UUID) -> None:
        self._reachable()
        self.workers.pop(worker_id, None)

    async def rescue(
        self, lease: float, grace: float, still_sure: Callable[[], bool], starting: bool = False
    ) -> list[RescuedJob]:
        # No sessions here (`liveness_key` is None): only the lease judges.
        self._reachable()
        if not still_sure():
            return []
        now = time.monotonic()
        for worker_id in [w for w, seen in self.workers.items() if now - seen.heartbeat_at > lease]:
            del self.workers[worker_id]
        rescued = []
        seconds = repr(float(lease)).removesuffix(".0")  # as PostgreSQL writes a float8
        for job in self.jobs.values():
            orphan = job.worker_id not in self.workers and job.id not in self.locked
            if job.status == JobStatus.PROCESSING and orphan:
                job.status, job.run_at = JobStatus.PENDING, now
                job.retry_count += 1
                job.error = f"the worker running this job was lost (no heartbeat for {seconds} s)"
                rescued.append(RescuedJob(job.id, job.task, job.queue))
        return rescued

    async def claim(self, spec: ClaimSpec, limit: int, running: list[str]) -> list[ClaimedJob]:
        self._reachable()
        self.claims += 1
        worker = self.workers.get(spec.worker_id)
        if worker is None:  # no lease, no claim: its jobs would look orphaned at once
            return []
        now = worker.heartbeat_at = time.monotonic()
        skip = set(running) | self.locked
        tasks = set(spec.tasks)  # a job of another task waits for a worker that has it
        due = sorted(
            (
                j
                for j in self.jobs.values()
                if j.status == JobStatus.PENDING
                and j.queue in spec.queues
                and j.queue not in self.paused_queues
                and j.task in tasks
                and j.run_at <= now
                and j.id not in skip
            ),
            # Work already started first within a priority, as the claim's scans order it.
            key=lambda j: (-j.priority, j.started_at is None, j.run_at, j.seq),
        )[:limit]
        first_stages = dict(zip(spec.pipelines, spec.first_stages, strict=True))
        task_limits = dict(zip(spec.retry_tasks, spec.retry_limits, strict=True))
        claimed = []
        for job in due:
            last_error, max_retries = job.error, job.max_retries
            if max_retries is None:
                max_retries = task_limits.get(job.task, spec.default_max_retries)
            job.status, job.worker_id, job.started_at, job.error = (
                JobStatus.PROCESSING,
                spec.worker_id,
                now,
                None,
            )
            stage = first_stages.get(job.task)
            starts = (
                stage is not None
                and not job.cancel_requested
                and job.retry_count <= max_retries
                and not self.stages.rows(job.id)
            )
            if starts:
                assert stage is not None
                self.stages.start_stage(job.id, stage, StageKind.STAGE, job.retry_count + 1, ())
            claimed.append(
                ClaimedJob(
                    job.id,
                    job.task,
                    job.payload,
                    job.queue,
                    job.priority,
                    job.retry_count,
                    max_retries,
                    job.cancel_requested,
                    job.answer,
                    last_error,
                    job.final_error,
                    first_stage_started=starts,
                )
            )
        return claimed

    async def release(self, worker_id: UUID, ids: list[str]) -> None:
        self._reachable()
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job and job.status == JobStatus.PROCESSING and job.worker_id == worker_id:
                job.status, job.run_at = JobStatus.PENDING, time.monotonic()

    async def held_jobs(self, worker_id: UUID) -> set[str]:
        self._reachable()
        return {
            j.id
            for j in self.jobs.values()
            if j.status == JobStatus.PROCESSING and j.worker_id == worker_id
        }

    def _guarded(
        self, worker_id: UUID, batch: Sequence[W], apply: Callable[[W], A]
    ) -> list[A | Locked | None]:
        """Apply each write of the attempt that holds its job; LOCKED where the job's row is
        locked, None where the job is no longer that attempt's."""
        self._reachable()
        return [
            None
            if not self._holds(worker_id, w.job_id, w.retries)
            else LOCKED
            if w.job_id in self.locked
            else apply(w)
            for w in batch
        ]

    async def record_outcomes(
        self, worker_id: UUID, policy: RetryPolicy, batch: Sequence[OutcomeWrite]
    ) -> list[RecordedOutcome | Locked | None]:
        return self._guarded(worker_id, batch, lambda write: self._record(policy, write))

    def _record(self, policy: RetryPolicy, write: OutcomeWrite) -> RecordedOutcome:
        """The job's status after its outcome, as `sql.RECORD_OUTCOMES` decides it."""
        job, o = self.jobs[write.job_id], write.outcome
        if o.kind == OutcomeKind.WAITING:  # `ctx.spawn` writes its children to PostgreSQL
            raise Unsupported("the in-memory driver has no spawned children to wait for")
        now, limit = time.monotonic(), write.max_retries
        comes_back = o.kind in (OutcomeKind.RETRY, OutcomeKind.SNOOZED, OutcomeKind.PAUSED)
        if comes_back and job.cancel_requested:
            job.status, job.run_at = JobStatus.PENDING, now  # the next claim settles it
        elif o.kind == OutcomeKind.RETRY and job.retry_count < limit:
            delay = o.delay
            if delay is None:  # the worker's backoff, with the statement's jitter
                backoff = min(policy.backoff_max, policy.backoff_base * 2**job.retry_count)
                delay = backoff * (0.5 + random.random() / 2)
            job.status, job.run_at = JobStatus.PENDING, now + delay
            job.retry_count += 1
        elif o.kind == OutcomeKind.RETRY:
            job.status = JobStatus.FAILED
        elif o.kind == OutcomeKind.SNOOZED:
            job.status, job.run_at = JobStatus.PENDING, now + (o.delay or 0.0)
        else:
            job.status = JobStatus(o.kind.value)
        if o.kind == OutcomeKind.COMPLETED:
            job.result = o.result
        if o.kind == OutcomeKind.PAUSED:
            job.question = o.result
        if o.error is not None or o.kind != OutcomeKind.SNOOZED:
            job.error = o.error
        if job.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
            job.finished_at = datetime.now(UTC)
        if o.stage_end is not None:
            end = o.stage_end
            error = None if end.status == StageStatus.COMPLETED else o.error
            self.stages.end_stage(job.id, end.stage, end.status, end.output, error)
        duration = now - job.started_at if job.started_at is not None else None
        return RecordedOutcome(job.id, job.status, job.task, job.queue, job.retry_count, duration)

    async def write_stages(
        self, worker_id: UUID, batch: Sequence[StageWrite]
    ) -> list[float | Locked | None]:
        return self._guarded(worker_id, batch, self._write_stage)

    def _write_stage(self, w: StageWrite) -> float:
        if w.ended is not None:
            self.stages.end_stage(w.job_id, w.ended, w.status, w.output, w.error)
        if w.started is None:
            return 0.0
        return self.stages.start_stage(w.job_id, w.started, w.kind, w.attempt, w.waiting)

    async def load_stages(self, job_id: str) -> StageHistory:
        self._reachable()
        return await self.stages.load(job_id)

    async def record_final_error(
        self, worker_id: UUID, job_id: str, retries: int, error: str
    ) -> bool:
        self._reachable()
        if not self._holds(worker_id, job_id, retries):
            return False
        self.jobs[job_id].final_error = error
        return True

    async def prune(self, statuses: list[str], before: datetime, batch: int) -> int:
        self._reachable()
        doomed = [
            j.id
            for j in self.jobs.values()
            if j.status in statuses and j.finished_at is not None and j.finished_at < before
        ][:batch]
        for job_id in doomed:
            del self.jobs[job_id]
            self.stages.forget(job_id)
        self.events = [e for e in self.events if e.job_id not in doomed]
        return len(doomed)

    async def fire_tick(
        self, key: str, task: str, spec: str, tick: datetime, queue: str
    ) -> str | None:
        self._reachable()
        last = self.schedules.get(key)
        if last is not None and last >= tick:
            return None  # fired already, here or by another worker
        self.schedules[key] = tick
        if last is None:
            return None  # first sight: the schedule fires from its next tick
        job_id = self.enqueue(task, queue=queue)
        self.jobs[job_id].run_at = time.monotonic() + (tick - datetime.now(UTC)).total_seconds()
        return job_id

    async def publish_stage_plans(self, plans: StagePlans) -> None:
        self._reachable()
        self.stage_plans = {**self.stage_plans, **plans}

    async def publish_task_limits(self, limits: Mapping[str, int]) -> None:
        self._reachable()
        self.task_limits = {**self.task_limits, **limits}

    async def roll_up(self) -> bool:
        self._reachable()
        self.rollups += 1
        return True

    async def publish_events(self, batch: Sequence[EventWrite]) -> list[str]:
        self._reachable()
        gone = sorted({e.job_id for e in batch if e.job_id not in self.jobs})
        for e in batch:
            if e.job_id in self.jobs:
                event = ProgressEvent(
                    id=next(self._event_ids),
                    job_id=e.job_id,
                    step=e.step,
                    status=e.status,  # type: ignore[arg-type]
                    message=None if e.message is None else json.loads(e.message),
                    created_at=e.created_at,
                )
                self.events.append(event)
        return gone

    async def read_events(self, job_id: str, after: int, limit: int) -> list[ProgressEvent]:
        self._reachable()
        return [e for e in self.events if e.job_id == job_id and e.id > after][:limit]
