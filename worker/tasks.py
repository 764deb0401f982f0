"""`@task`: registering the functions a worker can run, the `Context` a run sees, and the
exceptions a task raises to steer its job (`JobCancelled`, `Snooze`, `PauseForResolution`).

A task is a plain function (sync or `async`) taking the job's payload, a JSON object, and
returning a JSON value, stored as the job's result. A function with a second parameter gets a
`Context`, to report progress or notice a cancel request.

What it does not do: claim, run or record jobs (the daemon does, `worker.daemon`); what an
attempt is and how user code is called are in `worker.attempt`, pipelines in `worker.stages`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, overload

from worker.attempt import Executable, Runtime, abandoned_here, call, settled_before_start
from worker.encoding import dumps
from worker.models import JSON, ClaimedJob, EventStatus, Outcome, OutcomeKind, ProgressEvent
from worker.schedules import register_schedule, schedule_for

F = TypeVar("F", bound=Callable[..., Any])


class JobCancelled(Exception):
    """Raised inside a job (by `Context.raise_if_cancelled`) when a cancel was requested."""


MAX_SNOOZE_SECONDS = 365 * 86400.0  # a longer snooze is a bug; the timestamp would overflow


class Snooze(Exception):
    """Raised by `Context.snooze`: run this job again after `seconds`, without a retry."""

    def __init__(self, seconds: float) -> None:
        # Checked here, not in the database: a bad value must fail this job, not the batch
        # of outcomes it is written with.
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SNOOZE_SECONDS
        ):
            raise ValueError(
                f"snooze seconds must be a number from 0 to {MAX_SNOOZE_SECONDS:.0f}, "
                f"not {seconds!r}"
            )
        super().__init__(f"snoozed for {seconds} s")
        self.seconds = float(seconds)


class PauseForResolution(Exception):
    """Raise to park the job as `paused` until an operator resumes it with an answer.

    >>> raise PauseForResolution({"question": "Ship it?"})   # doctest: +SKIP
    """

    def __init__(self, question: JSON) -> None:
        # Checked here: the question is stored as JSON, and a bad one must fail the stage that
        # asked it with a clear error, not the worker recording it.
        try:
            dumps(question)
        except TypeError as exc:
            raise TypeError(f"the pause question is {exc}") from None
        super().__init__(str(question))
        self.question = question


@dataclass
class Context:
    """What a running job (or stage) can see and do.

    >>> def resize(payload, ctx):                      # doctest: +SKIP
    ...     for i, image in enumerate(payload["images"]):
    ...         ctx.raise_if_cancelled()
    ...         ctx.progress(100 * i / len(payload["images"]), image=image)
    """

    job: ClaimedJob
    runtime: Runtime
    cancel_event: threading.Event
    outputs: dict[str, JSON] = field(default_factory=dict)
    step: str = ""
    deadline: float | None = None  # time.monotonic() by which the job must finish

    @property
    def job_id(self) -> str:
        return self.job.id

    @property
    def payload(self) -> dict[str, JSON]:
        return self.job.payload

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def answer(self) -> JSON:
        """The operator's answer, once a paused job was resumed."""
        return self.job.answer

    @property
    def cancelled(self) -> bool:
        """True once a cancel was requested; long stages check it and stop early. In a sync
        function's thread, also once the job stopped waiting for it (it ran past a deadline)."""
        return self.cancel_event.is_set() or abandoned_here()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def progress(self, pct: float | None = None, **message: JSON) -> None:
        """Publish a `progress` event; never blocks the job, whatever the bus does."""
        if pct is not None:
            message = {"pct": pct, **message}
        self.emit(self.step or self.job.task, "progress", message or None)

    def emit(self, step: str, status: EventStatus, message: dict[str, JSON] | None = None) -> None:
        self.runtime.bus.publish(self.event(step, status, message))

    def event(
        self, step: str, status: EventStatus, message: dict[str, JSON] | None = None
    ) -> ProgressEvent:
        """A progress event of this job, stamped now and not published yet (`emit` does both)."""
        # Validated rather than built with `model_construct`: pydantic's compiled validation is
        # the faster of the two, and a pipeline publishes several events per stage. The time is
        # given: pydantic would inspect the default factory's signature on each call.
        return ProgressEvent(
            job_id=self.job_id,
            step=step,
            status=status,
            message=message,
            created_at=datetime.now(UTC),
        )

    def snooze(self, seconds: float) -> None:
        """Give the slot back and run this stage again in `seconds` (not counted as a retry)."""
        raise Snooze(seconds)

    def pause(self, question: JSON) -> None:
        """Park the job until an operator answers `question` (see `worker.resume`)."""
        raise PauseForResolution(question)


@dataclass
class Task:
    """A registered function. Created by `@task`; the function stays callable as before."""

    name: str
    fn: Callable[..., Any]
    timeout: float | None = None
    wants_context: bool = False
    is_async: bool = False

    async def execute(self, ctx: Context) -> Outcome:
        settled = settled_before_start(ctx.job, ctx.cancelled)
        if settled is not None:
            return settled
        args: tuple[Any, ...] = (ctx.payload, ctx) if self.wants_context else (ctx.payload,)
        return Outcome(OutcomeKind.COMPLETED, result=await call(ctx, self.fn, self.is_async, *args))


REGISTRY: dict[str, Executable] = {}


def register(entry: Executable) -> None:
    existing = REGISTRY.get(entry.name)
    if existing is not None and existing is not entry:
        raise ValueError(f"a task named {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry


@overload
def task(fn: F, /) -> F: ...
@overload
def task(
    *,
    name: str | None = None,
    timeout: float | None = None,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str | None = None,
) -> Callable[[F], F]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str | None = None,
) -> Any:
    """Register a function as a task; the worker runs it for jobs naming it.

    With `cron` (in zone `tz`, UTC by default) or `every` (seconds, or a timedelta), the
    workers also enqueue it with an empty payload at each tick (see `worker.schedules`).

    >>> @task
    ... def add(payload):
    ...     return payload["a"] + payload["b"]
    >>> @task(name="emails.send", timeout=30)
    ... async def send(payload):
    ...     return {"sent": True}
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        params = [
            p
            for p in inspect.signature(f).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        schedule = schedule_for(name or f.__name__, cron=cron, every=every, tz=tz)
        register(
            Task(
                name=name or f.__name__,
                fn=f,
                timeout=timeout,
                wants_context=len(params) >= 2,
                is_async=inspect.iscoroutinefunction(f),
            )
        )
        if schedule is not None:
            register_schedule(schedule)
        return f

    return decorate(fn) if fn is not None else decorate
