"""`@task`: registering the functions a worker can run, and what a run hands back.

A task is a plain function (sync or `async`) taking the job's payload, a JSON object, and
returning a JSON value, stored as the job's result. A function with a second parameter gets a
`Context`, to report progress or notice a cancel request.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from worker.models import EventStatus, ProgressEvent

if TYPE_CHECKING:
    from worker.events import ProgressBus

JSON = Any
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
    # The claim recorded the first stage of this pipeline job as running: its first run, so
    # it has no other stage rows (see `sql.CLAIM`).
    first_stage_started: bool = False

    @property
    def attempt(self) -> int:
        return self.retry_count + 1


@dataclass
class Outcome:
    """How an attempt ended, as the completer writes it (see `sql.RECORD_OUTCOMES`)."""

    kind: str  # completed | retry | failed | cancelled | paused | snoozed
    result: JSON = None
    # `result` as the JSON text stored, when the runner has encoded it already.
    result_json: str | None = None
    error: str | None = None
    delay: float = 0.0
    # A pipeline stage that ended with the attempt, recorded with the outcome (one commit).
    stage_end: StageEnd | None = None
    # Progress events that report this outcome: published once it is written, never before.
    events: list[ProgressEvent] = field(default_factory=list)


@dataclass
class StageEnd:
    """How a pipeline stage ended, when that is written with its job's outcome."""

    stage: str
    status: Literal["completed", "failed", "cancelled"]  # failed, cancelled: the job's error
    output: str | None = None  # JSON text, for a completed stage


class Runtime(Protocol):
    """What the daemon lends a running job: the progress bus and a way to run blocking code."""

    bus: ProgressBus

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any: ...


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
        told = getattr(_abandoned, "event", None)
        return self.cancel_event.is_set() or (told is not None and told.is_set())

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
        # Validated: pydantic's compiled validation takes half the time of `model_construct`,
        # which runs in Python (a pipeline publishes several events per stage). The time is
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


class NotStorable(TypeError):
    """A value PostgreSQL's `jsonb` cannot hold; the message, read after "the value", says why."""


# One encoder for every value: `json.dumps` with options builds a new encoder per call.
_ENCODE = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode
# An escaped NUL: `\u0000` after an even number of backslashes (an odd number means the
# backslash itself was escaped, and the text is the harmless characters "\u0000").
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps(value: JSON) -> str:
    """JSON text that PostgreSQL's `jsonb` accepts, or `NotStorable` saying why not.

    Python's encoder writes happily what `jsonb` refuses (NaN, a NUL character, half of a
    surrogate pair) and gives up on values nested thousands deep; every payload, result,
    output and question goes through here, so each is refused with the same clear words.

    >>> dumps({"a": [1, 2]})
    '{"a":[1,2]}'
    >>> dumps({"x": "a\\x00b"})
    Traceback (most recent call last):
    ...
    worker.tasks.NotStorable: is not storable: it contains a NUL character (\\u0000), ...
    """
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise NotStorable(f"is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise NotStorable("is nested too deeply to be stored as JSON") from None
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise NotStorable(
            "is not storable: it contains a NUL character (\\u0000), which PostgreSQL refuses"
        )
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise NotStorable(
                "is not storable: it contains half of a UTF-16 surrogate pair"
            ) from None
    return text


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


async def call(ctx: Context, fn: Callable[..., Any], is_async: bool, *args: Any) -> Any:
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
        return Outcome("cancelled", error="cancelled")
    if job.final_error is not None:
        return Outcome("failed", error=job.final_error)
    if job.retry_count > job.max_retries:
        return Outcome("failed", error=job.last_error or "out of attempts")
    return None


class Executable(Protocol):
    """Anything the registry can run: a `Task` or a `Pipeline`."""

    name: str
    timeout: float | None

    async def execute(self, ctx: Context) -> Outcome: ...


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
        return Outcome("completed", result=await call(ctx, self.fn, self.is_async, *args))


REGISTRY: dict[str, Executable] = {}


def register(entry: Executable) -> None:
    existing = REGISTRY.get(entry.name)
    if existing is not None and existing is not entry:
        raise ValueError(f"a task named {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry


@overload
def task(fn: F, /) -> F: ...
@overload
def task(*, name: str | None = None, timeout: float | None = None) -> Callable[[F], F]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Register a function as a task; the worker runs it for jobs naming it.

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
        register(
            Task(
                name=name or f.__name__,
                fn=f,
                timeout=timeout,
                wants_context=len(params) >= 2,
                is_async=inspect.iscoroutinefunction(f),
            )
        )
        return f

    return decorate(fn) if fn is not None else decorate
