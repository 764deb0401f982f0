"""The claim loop: claim as many jobs as there are free slots, run them, hand outcomes over.

While jobs finish within milliseconds, the loop also claims up to `PREFETCH_BATCHES` more
batches ahead (a prefetch), so the next jobs are at hand when slots free instead of one claim's
round trip later, and each claim and each outcome write serves more jobs. Jobs claimed ahead
are this worker's like running ones (cancel requests reach them, a stop hands them back); if no
slot frees for `PREFETCH_HOLD` seconds they go back to the queue for other workers, without
counting an attempt.

One asyncio loop per process. `async` tasks run on the loop, sync tasks in a thread pool of
`WORKER_CONCURRENCY` threads. The loop wakes at once on NOTIFY (a job inserted, a job resumed,
a cancel request) and, when idle, polls with exponential backoff from `WORKER_POLL_MIN` up to
`WORKER_POLL_MAX`: notifications are an optimisation, polling alone drains the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from worker.attempt import (
    ClaimedJob,
    Executable,
    Outcome,
    OutcomeKind,
    StageEnd,
    TaskTimeout,
    settled_before_start,
)
from worker.daemon.completer import Completer
from worker.daemon.db import Patience
from worker.daemon.duties import Heartbeat, Rescuer, Retention
from worker.daemon.stage_writes import StageWrites
from worker.db.driver import ClaimSpec, Driver, RecordedOutcome, Registration, StageWrite
from worker.db.notifier import Subscription, notifier
from worker.db.postgres import TRANSIENT, PostgresDriver, Refused, UnreadableJSON, describe
from worker.encoding import NotStorable, dumps
from worker.events import PostgresBus, ProgressBus
from worker.logs import fields
from worker.models import StageStatus
from worker.settings import Settings
from worker.stages import Pipeline, StageRow
from worker.tasks import REGISTRY, Context, JobCancelled, PauseForResolution, Snooze

log = logging.getLogger("worker.daemon")
job_log = logging.getLogger("worker.jobs")

# The job whose code runs in the current task. A context variable, not the task's name: a
# timeout (`asyncio.wait_for` before Python 3.12) runs the job's code in a task of its own.
_running_job: contextvars.ContextVar[str] = contextvars.ContextVar("running_job", default="")

# Claiming ahead pays while jobs take about a round trip; past this mean duration it would
# only keep jobs from other workers.
PREFETCH_BELOW_SECONDS = 0.05
# Batches of `WORKER_CONCURRENCY` jobs claimed ahead. Every claim and every outcome write is a
# commit: on 2 CPUs, 4 rather than 1 took a one-process drain of no-op jobs from 6,035 to
# 8,460 jobs/s (medians of 5 interleaved runs). The last job claimed ahead waits for a slot
# about 4 x 50 ms at most, well within `PREFETCH_HOLD`.
PREFETCH_BATCHES = 4
# Jobs claimed ahead go back to the queue if no slot frees for this long.
PREFETCH_HOLD = 0.5


def storable_text(text: str) -> str:
    """`text` as PostgreSQL's `text` accepts it: NUL shown as \\0, lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


def next_poll_delay(current: float, found_work: bool, poll_min: float, poll_max: float) -> float:
    """Idle polling: back to the minimum on work, else double up to the maximum."""
    return poll_min if found_work else min(current * 2, poll_max)


class PgStageStore:
    """Stage bookkeeping on the daemon's pool (see `stages.StageStore`)."""

    def __init__(self, driver: Driver, patience: Patience, worker_id: UUID) -> None:
        self._driver = driver
        self._patience = patience
        self._worker_id = worker_id
        self._writes = StageWrites(driver, worker_id)  # concurrent jobs' writes share one commit

    async def load(self, job_id: str) -> list[StageRow]:
        return await self._patience.run("reading stages", lambda: self._driver.load_stages(job_id))

    async def _run(self, doing: str, write: StageWrite) -> float:
        try:
            age = await self._patience.run(doing, lambda: self._writes.run(write))
        except Refused as exc:
            raise NotStorable(f"PostgreSQL refused to store ({exc})") from exc
        if age is None:
            raise JobLost(
                f"this worker no longer holds job {write.job_id} (it was rescued after a lost "
                "heartbeat); the attempt stops here"
            )
        return age

    async def started(
        self, job: ClaimedJob, stage: str, kind: str, attempt: int, waiting: Sequence[str] = ()
    ) -> float:
        write = StageWrite(
            job.id, job.retry_count, started=stage, kind=kind, attempt=attempt, waiting=(*waiting,)
        )
        return await self._run("recording a stage start", write)

    async def finished(
        self,
        job: ClaimedJob,
        stage: str,
        status: str,
        output: Any = None,
        error: str | None = None,
    ) -> None:
        error = storable_text(error) if error is not None else None
        write = StageWrite(
            job.id, job.retry_count, ended=stage, status=status, output=output, error=error
        )
        await self._run("recording a stage end", write)

    async def advance(
        self,
        job: ClaimedJob,
        done: str,
        output: Any,
        stage: str,
        kind: str,
        attempt: int,
        waiting: Sequence[str] = (),
    ) -> float:
        write = StageWrite(
            job.id,
            job.retry_count,
            ended=done,
            output=output,
            started=stage,
            kind=kind,
            attempt=attempt,
            waiting=(*waiting,),
        )
        return await self._run("recording a stage end and the next start", write)

    async def failed_for_good(self, job: ClaimedJob, error: str) -> None:
        error = storable_text(error)
        held = await self._patience.run(
            "recording a failure",
            lambda: self._driver.record_final_error(
                self._worker_id, job.id, job.retry_count, error
            ),
        )
        if not held:
            raise JobLost(f"this worker no longer holds job {job.id}; the attempt stops here")


class JobLost(Exception):
    """The job was taken from this worker (rescued) while it ran; its attempt stops."""


async def _wait_until_set(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for `event` at most `timeout` seconds. Unlike `asyncio.wait_for`, this makes no task
    to run the wait: a wake-up reaches the waiter one loop iteration after `set()`, not three."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


class DutyFailed(Exception):
    """One of the worker's own tasks (writing outcomes, the heartbeat, the rescuer,
    retention) failed on something retrying cannot mend. The worker stopped, rather
    than go on claiming jobs whose outcomes it could not write."""


class Worker:
    """A worker process's engine. `worker run` builds one and runs it until SIGTERM.

    >>> worker = Worker(url, settings)          # doctest: +SKIP
    >>> asyncio.run(worker.run())               # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        settings: Settings,
        *,
        registry: Mapping[str, Executable] = REGISTRY,
        bus: ProgressBus | None = None,
        driver: Driver | None = None,
    ) -> None:
        self.url = url
        self.settings = settings
        self.id = uuid.uuid4()
        self.registry = registry
        self.queues = list(settings.queues)
        self.concurrency = settings.concurrency
        self.bus: ProgressBus = bus if bus is not None else PostgresBus(url)
        self._stop = asyncio.Event()
        self._notified = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # Jobs this worker holds (claimed ahead or running), with their cancel flags.
        self._inflight: dict[str, threading.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the running ones
        self._ahead: deque[tuple[ClaimedJob, float]] = deque()  # claimed ahead, and when
        # Mean duration of recent jobs (moving average); prefetch waits for a first measure.
        self._job_seconds = float("inf")
        self._stuck: set[str] = set()  # jobs done, but their sync thread still runs
        self._threads: dict[str, int] = {}
        self._threads_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(settings.concurrency, "worker-task")
        self.driver: Driver = driver or PostgresDriver(url, settings.concurrency)
        self._patience = Patience(self._stop.is_set, self.driver.confirm_reachable)
        self.store = PgStageStore(self.driver, self._patience, self.id)
        self.processed = 0
        # Outcomes handed to the completer but not written yet: the database still shows these
        # jobs as ours, and `_release_unrun_holdings` must not hand them back.
        self._unwritten: set[str] = set()
        # A claim or hand-back failed after it may have committed: check what we hold.
        self._holdings_uncertain = False
        # Cancel requests seen while a claim is on its way: one made just after the claim
        # committed can be heard before the claim's answer, for a job not ours yet.
        self._claim_cancels: set[str] | None = None
        self._failure: DutyFailed | None = None
        self._subscriptions: list[Subscription] = []
        # Observers (`worker.metrics`): called on the event loop with each claim's round trip
        # and job count, and with each batch of recorded outcomes. They must be cheap.
        self.on_claim: Callable[[float, int], None] | None = None
        self.on_recorded: Callable[[list[RecordedOutcome]], None] | None = None

    # -- Runtime, as seen by running jobs ---------------------------------------------------

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking user code in the pool, counting the thread against its job's slot."""
        loop = asyncio.get_running_loop()
        key = _running_job.get()

        def tracked() -> Any:
            with self._threads_lock:
                self._threads[key] = self._threads.get(key, 0) + 1
            try:
                return fn(*args)
            finally:
                with self._threads_lock:
                    self._threads[key] -= 1
                    done = self._threads[key] == 0
                    if done:
                        del self._threads[key]
                if done and key in self._stuck:
                    loop.call_soon_threadsafe(self._thread_done, key)

        return await loop.run_in_executor(self._executor, tracked)

    def _thread_done(self, key: str) -> None:
        self._stuck.discard(key)
        self._start_ahead()
        log.warning(
            "job %s: its abandoned thread returned at last; slot free again",
            key,
            extra=fields("job.thread_returned", job_id=key),
        )
        self._slot_freed.set()

    # -- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get `WORKER_SHUTDOWN_GRACE` seconds to finish."""
        if not self._stop.is_set():
            log.info(
                "worker %s stopping: no new jobs; waiting for %d running",
                self.id,
                len(self._tasks),
                extra=fields("worker.stopping", worker_id=self.id, running=len(self._tasks)),
            )
        self._stop.set()
        self._notified.set()
        self._slot_freed.set()

    async def run(self) -> None:
        registration = Registration(
            self.id, socket.gethostname(), os.getpid(), self.queues, self.concurrency
        )
        await self.driver.open()
        await self._patience.run(
            "registering the worker", lambda: self.driver.register_worker(registration)
        )
        heartbeat = Heartbeat(
            self.driver, registration, self.settings.lease_seconds, self._cancel_requested
        )
        await heartbeat.beat()
        completer = Completer(
            self.driver, self.id, self.settings, self._patience, self.bus.publish, self._recorded
        )
        self._completer = completer
        await self.bus.start()
        duties = [
            asyncio.create_task(completer.run(), name="completer"),
            asyncio.create_task(heartbeat.run(), name="heartbeat"),
            asyncio.create_task(
                Rescuer(self.driver, heartbeat, self.settings.lease_seconds).run(), name="rescuer"
            ),
        ]
        # The process's one LISTEN connection wakes the claim loop and carries cancel
        # requests; it logs its own losses and reconnections.
        listener = notifier(self.url)
        self._subscriptions = [
            listener.subscribe_async("worker_jobs", self._jobs_notified),
            listener.subscribe_async("worker_cancel", self._cancel_notified),
        ]
        if self.settings.retention_enabled:
            duties.append(
                asyncio.create_task(Retention(self.driver, self.settings).run(), name="retention")
            )
        for duty in duties:
            duty.add_done_callback(self._duty_ended)
        log.info(
            "worker %s started: queues %s, concurrency %d, tasks %s",
            self.id,
            ",".join(self.queues),
            self.concurrency,
            ", ".join(sorted(self.registry)) or "none",
            extra=fields(
                "worker.started",
                worker_id=self.id,
                queues=self.queues,
                concurrency=self.concurrency,
                tasks=sorted(self.registry),
            ),
        )
        try:
            await self._claim_loop()
        finally:
            await self._shutdown(completer, duties)
        if self._failure is not None:
            raise self._failure

    def _duty_ended(self, duty: asyncio.Task[Any]) -> None:
        """A duty runs until the shutdown cancels it: one that ended on an error stops the
        worker, loudly, instead of leaving it claiming jobs nobody finishes."""
        exc = None if duty.cancelled() else duty.exception()
        if exc is None:
            return
        error = describe(exc)
        if self._failure is None:
            self._failure = DutyFailed(f"the worker's {duty.get_name()} failed: {error}")
        log.error(
            "the worker's %s failed: %s; the worker stops",
            duty.get_name(),
            error,
            exc_info=exc,
            extra=fields("worker.duty_failed", duty=duty.get_name(), error=error),
        )
        self.request_stop()

    async def _shutdown(self, completer: Completer, duties: list[asyncio.Task[Any]]) -> None:
        grace = self.settings.shutdown_grace
        with contextlib.suppress(*TRANSIENT, TimeoutError):  # what is left goes by RELEASE below
            await asyncio.wait_for(self._hand_back_ahead("the worker stops"), 10)
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks.values()), timeout=grace)
            if pending:
                log.warning(
                    "%d jobs still running after %.1f s; handing them back",
                    len(pending),
                    grace,
                    extra=fields("worker.handing_back", jobs=len(pending), grace=grace),
                )
                for job_id in list(self._tasks):
                    self._inflight[job_id].set()
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=2.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(completer.drain(), 30)
        if completer.pending:
            log.warning(
                "%d job outcomes not written (the database stayed unreachable for 30 s, their "
                "rows stay locked by another client, or writing them failed); those jobs will "
                "be rescued and run again",
                completer.pending,
                extra=fields("worker.outcomes_unwritten", jobs=completer.pending),
            )
        unfinished = list(self._inflight) + list(self._stuck)
        # After an outage, the pool's sessions from before it are replaced first: the oldest
        # idle one goes out next, and it would fail these last statements.
        await self._patience.confirmed(10)
        with contextlib.suppress(*TRANSIENT, TimeoutError):
            if self._holdings_uncertain:  # a claim or hand-back answer lost before the stop
                await asyncio.wait_for(self._release_unrun_holdings(), 10)
            if unfinished:
                await asyncio.wait_for(self.driver.release(self.id, unfinished), 10)
            await asyncio.wait_for(self.driver.deregister_worker(self.id), 10)
        for subscription in self._subscriptions:
            subscription.close()
        for task in duties:
            task.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        await self.bus.aclose()
        await self._patience.close()
        await self.driver.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        log.info(
            "worker %s stopped after %d jobs",
            self.id,
            self.processed,
            extra=fields("worker.stopped", worker_id=self.id, processed=self.processed),
        )

    # -- claiming ---------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        s = self.settings
        delay = s.poll_min
        # Read once, not per claim: a pipeline registered later still runs, its first stage
        # then recorded by the stage runner instead of the claim.
        spec = self._claim_spec()
        while not self._stop.is_set():
            short = self._job_seconds < PREFETCH_BELOW_SECONDS
            ahead = PREFETCH_BATCHES * self.concurrency if short else 0
            free = self.concurrency + ahead - len(self._inflight) - len(self._stuck)
            # Refill the jobs claimed ahead once they have all started: a claim per batch, not
            # one per slot freed.
            if free <= 0 or self._ahead:
                self._slot_freed.clear()
                await _wait_until_set(self._slot_freed, PREFETCH_HOLD if self._ahead else None)
                if self._ahead and time.monotonic() - self._ahead[0][1] >= PREFETCH_HOLD:
                    await self._hand_back_ahead(f"no slot freed within {PREFETCH_HOLD} s")
                    # Jobs now last long enough that claiming ahead would only keep them from
                    # other workers: not again until short jobs bring the average down.
                    self._job_seconds = max(self._job_seconds, PREFETCH_HOLD)
                continue
            self._notified.clear()
            claim_started = time.perf_counter()
            sent = time.monotonic()
            self._claim_cancels = set()
            try:
                if self._holdings_uncertain:
                    await self._release_unrun_holdings()
                rows = await self.driver.claim(spec, free, [*self._inflight, *self._stuck])
            except TRANSIENT as exc:
                # The claim may have committed with its answer lost: check before the next one.
                self._holdings_uncertain = True
                self._claim_cancels = None
                self._patience.failed("claiming jobs", exc, sent)
                # The notifier sets `_notified` when it is back: retry at once then.
                await _wait_until_set(self._notified, delay)
                delay = next_poll_delay(delay, False, s.poll_min, s.poll_max)
                continue
            self._patience.succeeded(sent)
            if self.on_claim is not None:
                self.on_claim(time.perf_counter() - claim_started, len(rows))
            self._take(rows)
            if len(rows) == free:
                delay = s.poll_min
                continue  # there may be more: claim again as soon as a slot frees
            if rows:
                delay = s.poll_min
            log.debug("idle: next poll in %.3f s", delay)
            await _wait_until_set(self._notified, delay)
            delay = next_poll_delay(
                delay, bool(rows) or self._notified.is_set(), s.poll_min, s.poll_max
            )

    def _claim_spec(self) -> ClaimSpec:
        """What every claim asks, with the registered pipelines and their first stages, for
        the claim to start them."""
        pipelines = [
            (name, entry.main_stages[0].name)
            for name, entry in self.registry.items()
            if isinstance(entry, Pipeline) and entry.main_stages
        ]
        return ClaimSpec(
            self.id,
            self.queues,
            self.settings.max_retries,
            [name for name, _ in pipelines],
            [stage for _, stage in pipelines],
        )

    def _take(self, rows: list[ClaimedJob]) -> None:
        """Hold the jobs a claim returned, and start as many as there are free slots."""
        claimed_at = time.monotonic()
        cancels, self._claim_cancels = self._claim_cancels or set(), None
        for job in rows:
            self._inflight[job.id] = threading.Event()  # its cancel flag
            if job.id in cancels:
                self._cancel_requested(job.id)
            self._ahead.append((job, claimed_at))
        self._start_ahead()

    async def _release_unrun_holdings(self) -> None:
        """Hand back jobs the database shows as ours that nobody here runs: those of a claim
        whose answer never arrived (the connection broke after the commit), or of a hand-back
        that may not have committed. Our heartbeat would keep the rescuer away from them for as
        long as this worker lives."""
        held = await self.driver.held_jobs(self.id)
        self._unwritten &= held  # the rest were written, or are no longer ours
        running = set(self._inflight) | self._stuck
        lost = [job_id for job_id in held - self._unwritten if job_id not in running]
        if lost:
            await self.driver.release(self.id, lost)
            log.warning(
                "%d jobs held by this worker but not run here (a claim or hand-back whose "
                "answer was lost) are back to pending",
                len(lost),
                extra=fields("claim.lost_released", jobs=len(lost)),
            )
        self._holdings_uncertain = False

    async def _hand_back_ahead(self, why: str) -> None:
        """Return the jobs claimed ahead to the queue, for another worker to run them sooner.
        Not an attempt."""
        if not self._ahead:
            return
        jobs = [job for job, _ in self._ahead]
        self._ahead.clear()  # out of reach of `_start_ahead` while the statement runs
        ids = [job.id for job in jobs]
        for job in jobs:
            self._inflight.pop(job.id, None)
        try:
            await self.driver.release(self.id, ids)
        except TRANSIENT:
            # It may have committed with its answer lost, so they are not run here: the check
            # before the next claim hands back those still ours.
            self._holdings_uncertain = True
            return
        log.info(
            "%d jobs claimed ahead went back to the queue: %s",
            len(jobs),
            why,
            extra=fields("claim.ahead_returned", jobs=len(jobs), reason=why),
        )

    def _start_ahead(self) -> None:
        """Start claimed jobs while slots are free."""
        while (
            self._ahead
            and not self._stop.is_set()
            and len(self._tasks) + len(self._stuck) < self.concurrency
        ):
            self._start(self._ahead.popleft()[0])

    def _start(self, job: ClaimedJob) -> None:
        cancel = self._inflight[job.id]  # set if a cancel request came while the job waited
        if job.cancel_requested:
            cancel.set()
        self._tasks[job.id] = asyncio.create_task(self._execute(job, cancel), name=f"job-{job.id}")
        if job_log.isEnabledFor(logging.INFO):
            job_log.info(
                "job %s (%s) started, attempt %d (queue %s)",
                job.id,
                job.task,
                job.attempt,
                job.queue,
                extra=fields(
                    "job.started",
                    job_id=job.id,
                    task=job.task,
                    queue=job.queue,
                    attempt=job.attempt,
                ),
            )

    async def _execute(self, job: ClaimedJob, cancel: threading.Event) -> None:
        began = time.monotonic()
        _running_job.set(job.id)
        entry = self.registry.get(job.task)
        try:
            unreadable = next(
                (v for v in (job.payload, job.answer) if isinstance(v, UnreadableJSON)), None
            )
            if unreadable is not None:
                outcome = Outcome(
                    OutcomeKind.FAILED,
                    error=f"the job's payload cannot be decoded: {unreadable.reason} (about "
                    "1000 levels); store it flatter or pass a reference",
                )
                if job.first_stage_started and isinstance(entry, Pipeline):
                    # The claim started its first stage, which cannot run either.
                    outcome.stage_end = StageEnd(entry.main_stages[0].name, StageStatus.FAILED)
            elif entry is None:
                # A cancel requested while the job waited wins over the unknown name.
                outcome = settled_before_start(job, cancel.is_set()) or Outcome(
                    OutcomeKind.FAILED,
                    error=f"no task named {job.task!r} is registered with this worker "
                    f"(known: {', '.join(sorted(self.registry)) or 'none'})",
                )
            else:
                timeout = entry.timeout or self.settings.task_timeout
                ctx = Context(
                    job,
                    self,
                    cancel,
                    deadline=time.monotonic() + timeout if timeout else None,
                )
                outcome = await self._attempt(entry, ctx)
                if (
                    outcome.kind in (OutcomeKind.COMPLETED, OutcomeKind.PAUSED)
                    and outcome.result_json is None
                ):
                    try:
                        outcome.result_json = dumps(outcome.result)
                    except NotStorable as exc:
                        outcome = Outcome(
                            OutcomeKind.FAILED, error=f"task {job.task} returned a value that {exc}"
                        )
            if outcome.error is not None:
                outcome.error = storable_text(outcome.error)
        except asyncio.CancelledError:
            return  # shutting down: the job is handed back by _shutdown
        finally:
            self._tasks.pop(job.id, None)
            # The attempt is over: threads it left running (past a deadline, or started by
            # the task itself) see `ctx.cancelled` from now on.
            cancel.set()
        with self._threads_lock:
            if job.id in self._threads:
                self._stuck.add(job.id)
                log.warning(
                    "job %s (%s) ended but its thread ignores the cancel and still "
                    "runs; it keeps its slot until it returns",
                    job.id,
                    job.task,
                    extra=fields("job.thread_stuck", job_id=job.id, task=job.task),
                )
        self._unwritten.add(job.id)
        self._inflight.pop(job.id, None)
        self._completer.add(job.id, job.retry_count, outcome)
        took = time.monotonic() - began
        average = self._job_seconds
        self._job_seconds = took if average == float("inf") else 0.8 * average + 0.2 * took
        self._start_ahead()
        self._slot_freed.set()

    async def _attempt(self, entry: Executable, ctx: Context) -> Outcome:
        try:
            return await entry.execute(ctx)
        except JobCancelled:
            return Outcome(OutcomeKind.CANCELLED, error="cancelled")
        except Snooze as snooze:
            return Outcome(OutcomeKind.SNOOZED, delay=snooze.seconds)
        except PauseForResolution as pause:
            return Outcome(OutcomeKind.PAUSED, result=pause.question)
        except TaskTimeout as exc:
            return Outcome(OutcomeKind.RETRY, error=str(exc))
        except JobLost as exc:
            log.warning("%s", exc, extra=fields("job.lost", job_id=ctx.job_id))
            return Outcome(OutcomeKind.RETRY, error=str(exc))  # the guarded outcome write skips it
        except Exception as exc:
            return Outcome(
                OutcomeKind.RETRY,
                error=f"{type(exc).__name__}: {exc}\n" + traceback.format_exc(limit=30),
            )

    def _recorded(self, rows: list[RecordedOutcome]) -> None:
        for row in rows:
            self._unwritten.discard(row.id)
        self.processed += len(rows)
        if self.on_recorded is not None:
            self.on_recorded(rows)
        if not job_log.isEnabledFor(logging.INFO):
            return
        for job_id, status, task, queue, retry_count, duration in (
            (r.id, r.status, r.task, r.queue, r.retry_count, r.duration) for r in rows
        ):
            # A job back to pending is a retry after a failed attempt, or a snooze.
            event = "job.requeued" if status == "pending" else f"job.{status}"
            job_log.info(
                "job %s (%s) %s after %.3f s (queue %s, retries %d)",
                job_id,
                task,
                "back to pending" if status == "pending" else status,
                duration or 0.0,
                queue,
                retry_count,
                extra=fields(
                    event,
                    job_id=job_id,
                    task=task,
                    queue=queue,
                    status=status,
                    duration=round(float(duration or 0.0), 6),
                    retry_count=retry_count,
                ),
            )

    # -- notifications ----------------------------------------------------------------------

    def _jobs_notified(self, queue: str | None) -> None:
        """A job became due in `queue` (None: news may have been missed, look anyway)."""
        if queue is None or queue in self.queues:
            self._notified.set()

    def _cancel_notified(self, job_id: str | None) -> None:
        # None: requests may have been missed; the heartbeat picks those up for held jobs.
        if job_id is not None:
            self._cancel_requested(job_id)

    def _cancel_requested(self, job_id: str) -> None:
        flag = self._inflight.get(job_id)
        if flag is None and self._claim_cancels is not None:
            self._claim_cancels.add(job_id)
        if flag is not None and not flag.is_set():
            job_log.info(
                "job %s cancel requested",
                job_id,
                extra=fields("job.cancel_requested", job_id=job_id),
            )
            flag.set()
