"""One attempt at a job: how user code is called within its deadline, and when a claimed job
must not run at all.

The claim produces a `ClaimedJob`; a `Task` or a `Pipeline` (an `Executable`, registered in
`worker.tasks`) turns it into an `Outcome` (both in `worker.models`), which the daemon's outcome
batcher writes. User code runs through `call`, which keeps sync code in a worker thread and
holds it to the job's deadline. Nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from worker.events import ProgressBus

from worker.models import ClaimedJob, Outcome, OutcomeKind


class Runtime(Protocol):
    """What the daemon lends a running job: the progress bus and a way to run blocking code."""

    bus: ProgressBus

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class Running(Protocol):
    """What `call` reads of the job's `Context` (`worker.tasks`): whose code runs, by when."""

    @property
    def job(self) -> ClaimedJob: ...

    @property
    def job_id(self) -> str: ...

    @property
    def runtime(self) -> Runtime: ...

    @property
    def deadline(self) -> float | None: ...


class TaskTimeout(Exception):
    """The job ran past its timeout (`@task(timeout=...)` or `WORKER_TASK_TIMEOUT`)."""


# In a sync function's thread: set once nobody waits for the call any more. Per call, not per
# job, so a stage abandoned at its deadline does not read as the job's cancel request.
_abandoned = threading.local()


def _told(abandoned: threading.Event, fn: Callable[..., Any], *args: Any) -> Any:
    outer, _abandoned.event = getattr(_abandoned, "event", None), abandoned
    try:
        return fn(*args)
    finally:
        _abandoned.event = outer


async def call(ctx: Running, fn: Callable[..., Any], is_async: bool, *args: Any) -> Any:
    """Run user code: `async` on the loop, sync in a worker thread, within the job's deadline.

    A sync function whose call is given up (past the job's or its stage's deadline, or at
    shutdown) cannot be stopped; its `ctx.cancelled` turns true in its thread at once (and in
    any thread of the job once the attempt ends), and it keeps its slot until it returns (the
    daemon reports it).
    """
    abandoned = None if is_async else threading.Event()
    work = fn(*args) if abandoned is None else ctx.runtime.in_thread(_told, abandoned, fn, *args)
    limit = None
    try:
        if ctx.deadline is None:
            return await work
        limit = asyncio.timeout(max(ctx.deadline - time.monotonic(), 0.0))
        async with limit:
            return await work
    except TimeoutError:
        if limit is None or not limit.expired():
            raise  # the code's own TimeoutError, not the job's timeout
        raise TaskTimeout(f"job {ctx.job_id} ({ctx.job.task}) ran past its timeout") from None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the job's own task is cancelled: the worker is shutting down
        # The code let through the cancellation of something it awaited. Passed on as is,
        # it would read as the worker's shutdown, and the job would be left running forever.
        raise RuntimeError(
            "the code raised asyncio.CancelledError while its job was not cancelled (a future "
            "or task it awaited was cancelled)"
        ) from exc
    finally:
        if abandoned is not None:
            abandoned.set()  # a thread still running is told; one that returned never looks


def settled_before_start(job: ClaimedJob, cancelled: bool = False) -> Outcome | None:
    """The outcome of a job that must not run at all: cancelled while it waited (in the queue,
    or, `cancelled`, claimed ahead of a free slot), failed for good by an attempt lost in its
    cleanups, or out of attempts after its worker was lost (see `sql.RESCUE`)."""
    if job.cancel_requested or cancelled:
        return Outcome(OutcomeKind.CANCELLED, error="cancelled")
    if job.final_error is not None:
        return Outcome(OutcomeKind.FAILED, error=job.final_error)
    if job.retry_count > job.max_retries:
        return Outcome(OutcomeKind.FAILED, error=job.last_error or "out of attempts")
    return None


def abandoned_here() -> bool:
    """True in a sync function's thread once nobody waits for its call any more."""
    told = getattr(_abandoned, "event", None)
    return told is not None and told.is_set()
