"""`@task`: registering the functions a worker can run, the `Context` a run sees, and the
exceptions a task raises to steer its job (`JobCancelled`, `Snooze`, `PauseForResolution`).

A task is a plain function (sync or `async`) taking the job's payload, a JSON object (or a
pydantic model it is validated into), and returning a JSON value, stored as the job's result.
A function with a second parameter gets a `Context`, to report progress or notice a cancel
request. `@task` returns the function's `Task`, a typed handle that enqueues jobs of it.

What it does not do: claim, run or record jobs (the daemon does, `worker.daemon`); what an
attempt is and how user code is called are in `worker.attempt`, pipelines in `worker.stages`.
"""

from __future__ import annotations

import functools
import inspect
import threading
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar, Unpack, overload

from pydantic import BaseModel, ValidationError

from worker.attempt import Runtime, abandoned_here, call, settled_before_start
from worker.client.errors import InvalidJob
from worker.client.validation import JobSpec
from worker.encoding import dumps
from worker.models import (
    JSON,
    ClaimedJob,
    EventStatus,
    JobEnding,
    Outcome,
    OutcomeKind,
    ParentCounts,
    ParentResult,
    ProgressEvent,
)
from worker.retries import DEFAULT_RULES, Backoff, RetryRules, rules
from worker.schedules import register_schedule, schedule_for

if TYPE_CHECKING:
    from worker.client import AsyncClient, Client, Job
    from worker.client.options import AsyncEnqueueOptions, EnqueueOptions

PayloadT = TypeVar("PayloadT")
R = TypeVar("R")


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


class WaitForChildren(Exception):
    """Raised by `Context.wait_for_children`: end this stage with `output`, and hold the job,
    with no slot, until every child it spawned has ended; then its next stage runs."""

    def __init__(self, output: JSON = None) -> None:
        super().__init__("waiting for the children it spawned")
        self.output = output


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
    # In a pipeline's cleanup: what becomes of the job after the attempt (None elsewhere).
    ending: JobEnding | None = None

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

    @functools.cached_property
    def parents(self) -> list[ParentResult]:
        """The parents of this job of a workflow, each with how it ended and its result, in
        the order they were added to the graph (empty for a job with none)."""
        return [p for p in map(ParentResult.read, self.job.parents or ()) if p.key is None]

    @property
    def children(self) -> list[ParentResult]:
        """The children this job spawned (`ctx.spawn`), each with its key, how it ended and its
        result, in the order they were first spawned."""
        return [p for p in map(ParentResult.read, self.job.parents or ()) if p.key is not None]

    @property
    def parent_counts(self) -> ParentCounts:
        """How this job's parents ended, counted by outcome: what a batch's `on_complete` or
        `on_failure` callback reads of its batch (all zero for a job with no parents)."""
        ended = Counter(p.status for p in self.parents)
        return ParentCounts(*(ended[s] for s in ("completed", "failed", "cancelled", "deleted")))

    @functools.cached_property
    def _by_name(self) -> dict[str, ParentResult]:  # built once: a fan-in reads thousands
        linked = reversed([*self.parents, *self.children])  # the first with a name wins
        return {n: p for p in linked for n in (p.node, p.job_id, p.key) if n is not None}

    def result_of(self, node: Any) -> JSON:
        """The result of the parent named `node` (or its `Node`), or of the child spawned with
        that key; `LookupError` if none has that name, or if it did not complete."""
        name = getattr(node, "name", node)
        parent = self._by_name.get(name) if isinstance(name, str) else None
        if parent is None:
            raise LookupError(f"{name!r} is neither a parent nor a child of job {self.job_id}")
        if parent.status != "completed":
            raise LookupError(f"parent {name} ended {parent.status}: it has no result")
        return parent.result

    def spawn(
        self, task: Task[Any, Any] | str, payload: Any = None, *, key: str, **options: Any
    ) -> Job:
        """Enqueue a child of this job once per `key` (`worker.client.spawn`): spawned again, it
        returns the first child (`duplicate` true). `options` are `enqueue`'s but `unique_key`."""
        return self.spawn_many(task, {key: payload}, **options)[0]

    def spawn_many(
        self, task: Task[Any, Any] | str, payloads: Mapping[str, Any], **options: Any
    ) -> list[Job]:
        """`spawn` a child of `task` per key of `payloads`, in one statement; their handles.

        >>> ctx.spawn_many(resize, {p: {"path": p} for p in paths})  # doctest: +SKIP
        """
        from worker.client.spawn import spawn_many

        url = getattr(self.runtime, "url", None)  # the worker's database, if it runs on one
        url = url if isinstance(url, str) else None
        return spawn_many(url, self.job_id, task, payloads, options)

    def wait_for_children(self, output: JSON = None) -> NoReturn:
        """In a pipeline's stage: end the stage with `output` and give the slot back; the next
        stage runs once every child spawned has ended, and reads them in `ctx.children`."""
        raise WaitForChildren(output)

    def snooze(self, seconds: float) -> None:
        """Give the slot back and run this stage again in `seconds` (not counted as a retry)."""
        raise Snooze(seconds)

    def pause(self, question: JSON) -> None:
        """Park the job until an operator answers `question` (see `worker.resume`)."""
        raise PauseForResolution(question)


class Task(Generic[PayloadT, R]):
    """A registered function, and its typed handle: what `@task` returns.

    Calling it calls the function, as before. `enqueue` and `enqueue_async` enqueue a job of
    it; when the function's payload parameter is a pydantic model, they take the model (or a
    dict) and refuse a payload that does not fit it with `InvalidJob` before anything is
    written, and the worker hands the function the validated model.

    >>> @task(max_retries=3)                                # doctest: +SKIP
    ... def resize(payload: Resize) -> dict[str, int]:
    ...     return {"width": payload.width}
    >>> job = resize.enqueue(Resize(path="a.png", width=640), queue="images")  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., R],
        timeout: float | None = None,
        wants_context: bool = False,
        is_async: bool = False,
        retries: RetryRules = DEFAULT_RULES,
        model: type[BaseModel] | None = None,
        concurrency: int | None = None,
        concurrency_key: Callable[[Any], str] | None = None,
    ) -> None:
        self.name = name
        self.fn = fn
        self.timeout = timeout
        self.wants_context = wants_context
        self.is_async = is_async
        self.retries = retries
        self.model = model
        # At most `concurrency` jobs sharing a key run at once, across all workers; the key of
        # a job enqueued through this handle is `concurrency_key(payload)`.
        self.concurrency = concurrency
        self.concurrency_key = concurrency_key
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<task {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    async def execute(self, ctx: Context) -> Outcome:
        # On the event loop only the cancel flag counts (`ctx.cancelled` also asks the thread).
        settled = settled_before_start(ctx.job, ctx.cancel_event.is_set())
        if settled is not None:
            return settled
        payload: Any = ctx.job.payload
        if self.model is not None:
            try:
                payload = self.model.model_validate(payload)
            except ValidationError as exc:  # no retry mends the payload
                error = f"the payload does not fit {self.model.__name__}: {field_error(exc)}"
                return Outcome(OutcomeKind.FAILED, error=error)
        args: tuple[Any, ...] = (payload, ctx) if self.wants_context else (payload,)
        return Outcome(OutcomeKind.COMPLETED, result=await call(ctx, self.fn, self.is_async, *args))

    def prepared(
        self, payload: PayloadT | dict[str, JSON] | None, options: dict[str, Any]
    ) -> tuple[dict[str, JSON], dict[str, Any]]:
        """The payload as stored and the enqueue's options: a model is dumped to JSON once it
        (or a dict) was validated against the task's model (`InvalidJob` naming the field
        that does not fit), and the job's concurrency key is the task's for this payload."""
        given: Any = {} if payload is None else payload
        stored: dict[str, JSON] = given
        if self.model is not None:
            try:
                given = given if isinstance(given, self.model) else self.model.model_validate(given)
            except ValidationError as exc:
                raise InvalidJob(f"payload {field_error(exc)}") from None
            stored = given.model_dump(mode="json")
        if self.concurrency_key is not None and options.get("concurrency_key") is None:
            try:
                key = self.concurrency_key(given)
            except Exception as exc:  # the payload lacks what the key is made of
                raise InvalidJob(f"concurrency_key: {type(exc).__name__}: {exc}") from None
            if not isinstance(key, str):
                raise InvalidJob(f"concurrency_key must return a str, not {type(key).__name__}")
            options = {**options, "concurrency_key": key}
        return stored, options

    def spec(self, payload: PayloadT | dict[str, JSON] | None = None, **options: Any) -> JobSpec:
        """A `JobSpec` of this task for `enqueue_many`, its payload validated first."""
        stored, options = self.prepared(payload, options)
        return JobSpec(self.name, stored, **options)

    def enqueue(
        self,
        payload: PayloadT | dict[str, JSON] | None = None,
        *,
        client: Client | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue a job of this task (with `client`, else the default one); see
        `Client.enqueue` for the options."""
        from worker.client import default_client

        stored, given = self.prepared(payload, dict(options))
        return (client or default_client()).enqueue(self.name, stored, **given)

    async def enqueue_async(
        self,
        payload: PayloadT | dict[str, JSON] | None = None,
        *,
        client: AsyncClient,
        **options: Unpack[AsyncEnqueueOptions],
    ) -> Job:
        """`enqueue` on an `AsyncClient`."""
        stored, given = self.prepared(payload, dict(options))
        return await client.enqueue(self.name, stored, **given)


def field_error(exc: ValidationError) -> str:
    """The first problem pydantic found, naming its field: `width: Input should be ...`."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _payload_model(
    fn: Callable[..., Any], first: inspect.Parameter | None
) -> type[BaseModel] | None:
    """The pydantic model the function's payload parameter is annotated with, if any."""
    if first is None:
        return None
    try:
        annotation = typing.get_type_hints(fn).get(first.name, first.annotation)
    except (NameError, TypeError):  # an annotation not resolvable here: no model
        annotation = first.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


class Executable(Protocol):
    """Anything the registry can run: a `Task` or a `Pipeline`."""

    name: str
    timeout: float | None
    retries: RetryRules  # what a failure leads to (`worker.retries`)
    concurrency: int | None  # jobs sharing a concurrency key that may run at once

    async def execute(self, ctx: Context) -> Outcome: ...


REGISTRY: dict[str, Executable] = {}


def register(entry: Executable) -> None:
    existing = REGISTRY.get(entry.name)
    if existing is not None and existing is not entry:
        raise ValueError(f"a task named {entry.name!r} is already registered")
    REGISTRY[entry.name] = entry


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[[PayloadT, Context], R], /) -> Task[PayloadT, R]: ...
    @overload
    def __call__(self, fn: Callable[[PayloadT], R], /) -> Task[PayloadT, R]: ...


@overload
def task(fn: Callable[[PayloadT, Context], R], /) -> Task[PayloadT, R]: ...
@overload
def task(fn: Callable[[PayloadT], R], /) -> Task[PayloadT, R]: ...
@overload
def task(
    *,
    name: str | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
    backoff: Backoff | None = None,
    give_up_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    concurrency: int | None = None,
    concurrency_key: Callable[[Any], str] | None = None,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str | None = None,
    queue: str | None = None,
) -> _Decorator: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
    backoff: Backoff | None = None,
    give_up_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    concurrency: int | None = None,
    concurrency_key: Callable[[Any], str] | None = None,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str | None = None,
    queue: str | None = None,
) -> Any:
    """Register a function as a task; the worker runs it for jobs naming it. Returns its
    `Task`, callable as the function was, with `enqueue` and `enqueue_async`.

    `max_retries`, `backoff` and `give_up_on` are its retry policy (`worker.retries`).
    `concurrency_key` names a job's key from its payload, and `concurrency` (1 by default) is
    how many jobs sharing a key may run at once, across all workers.

    With `cron` (in zone `tz`, UTC by default) or `every` (seconds, or a timedelta), the
    workers also enqueue it with an empty payload at each tick (see `worker.schedules`), in
    the queue `queue` (`default` if not given).

    >>> @task
    ... def add(payload):
    ...     return payload["a"] + payload["b"]
    >>> add({"a": 1, "b": 2})
    3
    >>> @task(name="emails.send", timeout=30, max_retries=5, give_up_on=ValueError)
    ... async def send(payload):
    ...     return {"sent": True}
    """
    retry_rules = rules(max_retries, backoff, give_up_on)
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValueError(f"concurrency must be an integer of at least 1, not {concurrency!r}")
    if concurrency is not None and concurrency_key is None:
        raise ValueError("concurrency needs a concurrency_key: the jobs it applies to share one")
    if concurrency_key is not None and not callable(concurrency_key):
        raise ValueError("concurrency_key must be a function of the payload, returning a str")

    def decorate(f: Callable[..., Any]) -> Task[Any, Any]:
        params = [
            p
            for p in inspect.signature(f).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        schedule = schedule_for(name or f.__name__, cron=cron, every=every, tz=tz, queue=queue)
        entry: Task[Any, Any] = Task(
            name=name or f.__name__,
            fn=f,
            timeout=timeout,
            wants_context=len(params) >= 2,
            is_async=inspect.iscoroutinefunction(f),
            retries=retry_rules,
            model=_payload_model(f, params[0] if params else None),
            concurrency=None if concurrency_key is None else concurrency or 1,
            concurrency_key=concurrency_key,
        )
        register(entry)
        if schedule is not None:
            register_schedule(schedule)
        return entry

    return decorate(fn) if fn is not None else decorate
