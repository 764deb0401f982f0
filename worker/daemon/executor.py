"""Runs attempts: a claimed job in, an `Outcome` out, within its timeout and its slot.

`async` tasks run on the event loop, sync ones in a thread pool of `WORKER_CONCURRENCY`
threads (`in_thread`, the `Runtime` a job sees). A job's slot is held by its task and by any
thread its code left running: a thread that ignores its cancel past the attempt's end keeps
the slot until it returns (and the log says so). Whatever the job raises becomes an outcome
here: a retry with the traceback, a cancel, a snooze, a pause, a timeout.

What this does not do: it does not claim, nor write outcomes; it hands each outcome to
`finished`, and tells `slot_freed` when an abandoned thread returns at last.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from worker import tracing
from worker.attempt import Runtime, TaskTimeout
from worker.daemon.stage_store import JobLost, storable_text
from worker.db.driver import UnreadableJSON
from worker.encoding import NotStorable, dumps
from worker.logs import fields, log_info
from worker.middleware import around
from worker.models import ClaimedJob, Outcome, OutcomeKind, StageEnd, StageStatus
from worker.settings import Settings
from worker.stages import Pipeline
from worker.tasks import (
    Context,
    Executable,
    JobCancelled,
    PauseForResolution,
    Snooze,
    WaitForChildren,
)

log = logging.getLogger("worker.daemon")
job_log = logging.getLogger("worker.jobs")

# The job whose code runs in the current task. A context variable, not the task's name: a
# timeout (`asyncio.wait_for` before Python 3.12) runs the job's code in a task of its own.
_running_job: contextvars.ContextVar[str] = contextvars.ContextVar("running_job", default="")


class Executor:
    """The running attempts of one worker and the threads they use."""

    def __init__(
        self,
        registry: Mapping[str, Executable],
        settings: Settings,
        runtime: Runtime,
        finished: Callable[[ClaimedJob, Outcome, float], None],
        slot_freed: Callable[[], None],
        middleware: Sequence[object] = (),
    ) -> None:
        self._registry = registry
        self._middleware = middleware  # `worker.middleware`: around every attempt
        self._settings = settings
        self._runtime = runtime
        self._finished = finished
        self._slot_freed = slot_freed
        self.tasks: dict[str, asyncio.Task[None]] = {}  # the running attempts
        self.stuck: set[str] = set()  # jobs done, but their sync thread still runs
        self._threads: dict[str, int] = {}
        self._threads_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(settings.concurrency, "worker-task")

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
                if done and key in self.stuck:
                    loop.call_soon_threadsafe(self._thread_done, key)

        # In the caller's context, as `asyncio.to_thread` runs it: spans the code starts are
        # children of its stage's or attempt's span (`worker.tracing`).
        return await loop.run_in_executor(self._pool, contextvars.copy_context().run, tracked)

    def _thread_done(self, key: str) -> None:
        self.stuck.discard(key)
        log.warning(
            "job %s: its abandoned thread returned at last; slot free again",
            key,
            extra=fields("job.thread_returned", job_id=key),
        )
        self._slot_freed()

    def start(self, job: ClaimedJob, cancel: threading.Event) -> None:
        """Start an attempt at `job`; `cancel` is its cancel flag."""
        if job.cancel_requested:
            cancel.set()
        self.tasks[job.id] = asyncio.create_task(self._execute(job, cancel), name=f"job-{job.id}")
        if job_log.isEnabledFor(logging.INFO):
            log_info(
                job_log,
                "job.started",
                "job %s (%s) started, attempt %d (queue %s)",
                job.id,
                job.task,
                job.attempt,
                job.queue,
                job_id=job.id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
            )

    async def _execute(self, job: ClaimedJob, cancel: threading.Event) -> None:
        began = time.monotonic()
        _running_job.set(job.id)
        try:
            # The attempt's span continues the trace the job was enqueued in.
            with tracing.attempt_span(job) as span:
                outcome = await self._outcome(job, cancel)
                tracing.ended(span, job, outcome)
        except asyncio.CancelledError:
            return  # shutting down: the job is handed back by the worker's shutdown
        finally:
            self.tasks.pop(job.id, None)
            # The attempt is over: threads it left running (past a deadline, or started by
            # the task itself) see `ctx.cancelled` from now on.
            cancel.set()
        with self._threads_lock:
            if job.id in self._threads:
                self.stuck.add(job.id)
                log.warning(
                    "job %s (%s) ended but its thread ignores the cancel and still "
                    "runs; it keeps its slot until it returns",
                    job.id,
                    job.task,
                    extra=fields("job.thread_stuck", job_id=job.id, task=job.task),
                )
        self._finished(job, outcome, time.monotonic() - began)

    async def _outcome(self, job: ClaimedJob, cancel: threading.Event) -> Outcome:
        # Registered: a worker claims only the tasks it registered (`ClaimSpec.tasks`).
        entry = self._registry[job.task]
        unreadable = job.payload if isinstance(job.payload, UnreadableJSON) else job.answer
        if isinstance(unreadable, UnreadableJSON):
            outcome = Outcome(
                OutcomeKind.FAILED,
                error=f"the job's payload cannot be decoded: {unreadable.reason} (about "
                "1000 levels); store it flatter or pass a reference",
            )
            if job.first_stage_started and isinstance(entry, Pipeline):
                # The claim started its first stage, which cannot run either.
                outcome.stage_end = StageEnd(entry.main_stages[0].name, StageStatus.FAILED)
        else:
            timeout = entry.timeout or self._settings.task_timeout
            ctx = Context(
                job,
                self._runtime,
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
        return outcome

    async def _attempt(self, entry: Executable, ctx: Context) -> Outcome:
        """Run the job's code inside the middleware, if any is registered."""
        if not self._middleware:
            return await self._run(entry, ctx)
        return await around(self._middleware, ctx, lambda: self._run(entry, ctx))

    async def _run(self, entry: Executable, ctx: Context) -> Outcome:
        """Run the job's code; whatever it raises becomes the attempt's outcome."""
        try:
            return await entry.execute(ctx)
        except JobCancelled:
            return Outcome(OutcomeKind.CANCELLED, error="cancelled")
        except Snooze as snooze:
            return Outcome(OutcomeKind.SNOOZED, delay=snooze.seconds)
        except PauseForResolution as pause:
            return Outcome(OutcomeKind.PAUSED, result=pause.question)
        except WaitForChildren:  # a task has no next stage to run once its children end
            error = (
                "wait_for_children() ends a pipeline's stage: a task cannot wait for its children"
            )
            return Outcome(OutcomeKind.FAILED, error=error)
        except JobLost as exc:
            log.warning("%s", exc, extra=fields("job.lost", job_id=ctx.job_id))
            return Outcome(OutcomeKind.RETRY, error=str(exc))  # the guarded outcome write skips it
        except TaskTimeout as exc:
            error = f"{type(exc).__name__}: {exc}"  # named like any other exception's
            return entry.retries.outcome(exc, ctx.job.retry_count, error)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}\n" + traceback.format_exc(limit=30)
            return entry.retries.outcome(exc, ctx.job.retry_count, error)

    async def stop(self, grace: float, flags: Mapping[str, threading.Event]) -> None:
        """Give running attempts `grace` seconds; then cancel them (their `flags` first)."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks.values()), timeout=grace)
        if not pending:
            return
        n = len(pending)
        extra = fields("worker.handing_back", jobs=n, grace=grace)
        log.warning("%d jobs still running after %.1f s; handing them back", n, grace, extra=extra)
        for job_id in list(self.tasks):
            flags[job_id].set()
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=2.0)

    def close(self) -> None:
        """Let go of the threads (one still running cannot be stopped, only abandoned)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
