"""The client side: enqueue jobs, hold a `Job` handle, wait, cancel, resume, retry, prune.

Two clients with the same verbs: `Client` (blocking, for scripts and web handlers) and
`AsyncClient` (for asyncio services). The module-level functions (`enqueue`, `enqueue_many`,
`resume`, ...) use a default `Client` built from the settings.

    from worker import enqueue

    job = enqueue("send_email", {"to": "ada@example.com"})
    print(job.wait_sync(timeout=30))

Waiting is woken by the `worker_done` notification a worker sends when it records a job's
outcome. Every waiter of a process shares one listening connection per database, and rechecks
the job every `WAIT_RECHECK_SECONDS` anyway, so a notification lost to a dropped connection
delays a waiter by at most that long and never strands it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, Result, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from worker.db import sql
from worker.db.connect import async_engine, sync_engine
from worker.db.direct import AsyncDirectWrites, DirectWrites
from worker.db.notifier import LINGER_SECONDS, Subscription, notifier
from worker.db.url import database_url, psycopg_url
from worker.encoding import NotStorable, dumps
from worker.models import TERMINAL_STATUSES, JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE
from worker.settings import get_settings

JSON = Any
log = logging.getLogger("worker.client")

# How often a waiter re-reads the job even without a notification (a missed NOTIFY, a
# reconnect): the notification is the fast path, this is the safety net.
WAIT_RECHECK_SECONDS = 2.0
# How long a waiter lets the shared listener connect before its first read; past that (the
# database unreachable for a moment) it waits by rechecking alone until the listener is back.
LISTEN_READY_SECONDS = 5.0
# The shared listener closes its connection once no one has waited for this long.
LISTEN_LINGER_SECONDS = LINGER_SECONDS
# `application_name` of the listening connection, to find it in pg_stat_activity.
LISTENER_NAME = "durable-worker wait"


class JobError(RuntimeError):
    """A job you waited on ended `failed` or `cancelled`.

    `.job` is the job's final state and `.error` its error (the task's exception and
    traceback, or why it was cancelled).

    >>> try:                                    # doctest: +SKIP
    ...     job.wait_sync()
    ... except JobError as exc:
    ...     print(exc.job.status, exc.error)
    """

    def __init__(self, job: Job) -> None:
        detail = f": {job.error}" if job.error else ""
        super().__init__(f"job {job.job_id} ({job.task}) {job.status}{detail}")
        self.job = job
        self.error = job.error


class JobFailed(JobError):
    """The job ran out of retries (or could not run at all, e.g. an unknown task)."""


class JobCancelledError(JobError):
    """The job was cancelled."""


class InvalidJob(ValueError):
    """A job was refused before anything was written: the message names the problem."""


class JobNotFound(LookupError):
    """No job has this id (it may have been removed by retention)."""


class InvalidTransition(RuntimeError):
    """The job is not in a status that allows the action (e.g. resuming a job not paused)."""


@dataclass
class JobSpec:
    """One job to enqueue (used by `enqueue_many`).

    >>> JobSpec("send_email", {"to": "ada@example.com"}, queue="emails", delay=60)
    JobSpec(task='send_email', payload={'to': 'ada@example.com'}, queue='emails', priority=0, \
delay=60, run_at=None, max_retries=None)
    """

    task: str
    payload: dict[str, JSON] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    delay: float | timedelta = 0.0
    run_at: datetime | None = None
    max_retries: int | None = None


# What the columns hold: `max_retries` is a 4-byte integer, and a time a job is due must be
# one Python can read back (years 1 to 9999), or every listing that shows the job fails.
MAX_RETRIES_LIMIT = 2**31 - 1
MAX_DELAY = timedelta(days=365 * 100)
RUN_AT_YEARS = (2, 9998)  # in UTC


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text_problem(value: str) -> str | None:
    """Why PostgreSQL would not store `value` as given (text holds neither NUL nor half a
    surrogate pair), or None. The API's request checks call it too."""
    if "\x00" in value:
        return "must not contain a NUL character (\\u0000)"
    try:
        value.encode()
    except UnicodeEncodeError:
        return "must not contain half of a UTF-16 surrogate pair"
    return None


def run_at_problem(run_at: datetime) -> str | None:
    """Why a due time could not be read back (outside `RUN_AT_YEARS` in UTC), or None."""
    low, high = RUN_AT_YEARS
    try:
        year = run_at.astimezone(UTC).year
    except OverflowError:  # year 1 east of UTC, or 9999 west of it, is outside Python's range
        year = 0
    return None if low <= year <= high else f"must fall between the years {low} and {high}"


def _bad_name(value: object, longest: int) -> bool:
    if not isinstance(value, str) or not 1 <= len(value) <= longest:
        return True
    return text_problem(value) is not None


def _job_id(job_id: str | UUID) -> str:
    """The id as text; a malformed one names no job (`JobNotFound`), as an unknown one does."""
    try:
        return str(job_id if isinstance(job_id, UUID) else UUID(str(job_id)))
    except ValueError:
        raise JobNotFound(f"no job {job_id!r}: not a job id") from None


def _stored_json(value: JSON, what: str, max_bytes: int, hint: str = "") -> str:
    """`value` as the JSON text stored, or `InvalidJob` naming `what` is wrong with it: not
    storable, or over `max_bytes` (WORKER_MAX_PAYLOAD_BYTES)."""
    try:
        text_ = dumps(value)
    except NotStorable as exc:
        raise InvalidJob(f"{what} {exc}") from None
    size = len(text_) if text_.isascii() else len(text_.encode())
    if size > max_bytes:
        raise InvalidJob(
            f"{what} is {size} bytes; the limit is {max_bytes} (WORKER_MAX_PAYLOAD_BYTES){hint}"
        )
    return text_


def _deadline(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        raise ValueError(f"timeout must be a number of seconds or None, not {timeout!r}")
    return time.monotonic() + timeout


def _validated(spec: JobSpec, max_bytes: int) -> dict[str, Any]:
    if _bad_name(spec.task, MAX_TASK_NAME):
        raise InvalidJob(
            f"task name must be a string of 1 to {MAX_TASK_NAME} characters, with no NUL"
        )
    if not isinstance(spec.payload, dict):
        raise InvalidJob(
            f"payload must be a JSON object (a dict), not {type(spec.payload).__name__}"
        )
    hint = ": store large data elsewhere and pass a reference"
    text_ = _stored_json(spec.payload, "payload", max_bytes, hint)
    if _bad_name(spec.queue, 255):
        raise InvalidJob("queue name must be a string of 1 to 255 characters, with no NUL")
    low, high = PRIORITY_RANGE
    if not _is_int(spec.priority) or not low <= spec.priority <= high:
        raise InvalidJob(f"priority must be an integer from {low} to {high}")
    if spec.max_retries is not None and (
        not _is_int(spec.max_retries) or not 0 <= spec.max_retries <= MAX_RETRIES_LIMIT
    ):
        raise InvalidJob(f"max_retries must be an integer from 0 to {MAX_RETRIES_LIMIT}")
    delay = spec.delay.total_seconds() if isinstance(spec.delay, timedelta) else spec.delay
    if (
        not isinstance(delay, int | float)
        or isinstance(delay, bool)
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY.total_seconds()
    ):
        raise InvalidJob("delay must be a number of seconds or a timedelta, from 0 to 100 years")
    if spec.run_at is not None:
        if not isinstance(spec.run_at, datetime) or spec.run_at.tzinfo is None:
            raise InvalidJob("run_at must be a timezone-aware datetime (e.g. datetime.now(UTC))")
        problem = run_at_problem(spec.run_at)
        if problem is not None:
            raise InvalidJob(f"run_at {problem}")
    return {
        "task": spec.task,
        "payload": text_,
        "queue": spec.queue,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": float(delay),
        "max_retries": spec.max_retries,
    }


def _as_spec(item: object) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if isinstance(item, tuple) and 1 <= len(item) <= 2:
        return JobSpec(*item)
    raise InvalidJob(f"expected a JobSpec or a (task, payload) tuple, not {type(item).__name__}")


@dataclass
class _Batch:
    """Jobs for `enqueue_many`, every one validated, with their new ids."""

    specs: list[JobSpec]
    ids: list[str]
    rows: list[dict[str, Any]]  # each job's parameters of `sql.ENQUEUE`, less its id

    def params(self) -> dict[str, Any]:
        """The parameters of `sql.ENQUEUE_MANY`."""
        # The payloads are already JSON text: they go in as they are, not encoded a second time.
        names = self._names(dumps)
        parts = []
        for job_id, r in zip(self.ids, self.rows, strict=True):
            run_at, retries = r["run_at"], r["max_retries"]
            ra = "null" if run_at is None else f'"{run_at.isoformat()}"'
            mr = "null" if retries is None else str(retries)
            parts.append(
                f'{{"i":"{job_id}","t":{names[r["task"]]},"p":{r["payload"]},'
                f'"q":{names[r["queue"]]},"pr":{r["priority"]},"ra":{ra},"d":{r["delay"]!r},'
                f'"mr":{mr}}}'
            )
        return {"jobs": f"[{','.join(parts)}]"}

    def copy_rows(self) -> str | None:
        """The rows of `sql.ENQUEUE_MANY_COPY`, or None if a job waits (a delay or a run_at:
        its run_at must come from the server's clock, which COPY cannot read)."""
        if any(r["run_at"] is not None or r["delay"] for r in self.rows):
            return None
        names = self._names(lambda name: name.translate(_COPY_ESCAPES))
        lines = []
        for job_id, r in zip(self.ids, self.rows, strict=True):
            payload, retries = r["payload"], r["max_retries"]
            t, q = names[r["task"]], names[r["queue"]]
            if "\\" in payload:  # JSON text holds no tab or newline, only escapes of them
                payload = payload.replace("\\", "\\\\")
            mr = "\\N" if retries is None else str(retries)
            lines.append(f"{job_id}\t{t}\t{payload}\t{q}\t{r['priority']}\t{mr}\n")
        return "".join(lines)

    def _names(self, encode: Callable[[str], str]) -> dict[str, str]:
        """Every task and queue name of the batch, encoded once (a batch repeats a few)."""
        return {
            name: encode(name) for name in {n for r in self.rows for n in (r["task"], r["queue"])}
        }


# What COPY's text format escapes in a value (its delimiter, its row end, and the escape).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _prepared_many(jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]], max_bytes: int) -> _Batch:
    """Every job validated before anything is written; the first bad one is named by index."""
    specs: list[JobSpec] = []
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(jobs):
        try:
            spec = _as_spec(item)
            rows.append(_validated(spec, max_bytes))
        except InvalidJob as exc:
            raise InvalidJob(f"job {i}: {exc}") from None
        specs.append(spec)
    return _Batch(specs, new_job_ids(len(rows)), rows)


def new_job_id() -> str:
    """A UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

    Ids made together sort together, so new rows share primary-key pages (the column default,
    `worker.uuid_v7()`, makes the same kind).

    >>> UUID(new_job_id()).version
    7
    """
    return new_job_ids(1)[0]


def new_job_ids(n: int) -> list[str]:
    """`n` UUIDv7 ids of this millisecond, as text (built as text: 1,000 at a time is hot)."""
    stamp = f"{time.time_ns() // 1_000_000:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7"
    noise = os.urandom(10 * n).hex()  # 20 random hex digits per id, 19 used
    return [
        f"{head}{r[:3]}-{_VARIANT[r[3]]}{r[4:7]}-{r[7:19]}"
        for r in (noise[k : k + 20] for k in range(0, 20 * n, 20))
    ]


# The RFC 9562 variant (binary 10xx) in the top bits of the 17th hex digit, two random below.
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


@lru_cache(maxsize=8)
def _portable(statement: str) -> TextClause:
    """A `%(name)s` statement as a SQLAlchemy text clause, so it runs on the driver of the
    caller's connection (psycopg or asyncpg): its casts are written `CAST(x AS t)`, which
    `text()` leaves alone, unlike `::t` after a parameter."""
    return text(re.sub(r"%\((\w+)\)s", r":\1", statement))


def _parse_duration(value: str | float | timedelta) -> timedelta:
    """A duration: "30s", "15m", "12h", "7d", "2w", a number of seconds or a timedelta, of
    at most 100 years (past that, a finished time cannot be older)."""
    try:
        if isinstance(value, timedelta):
            age = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            age = timedelta(seconds=value)
        elif isinstance(value, str):
            units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
            match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value.lower())
            if match is None:
                raise ValueError(
                    f"older_than must look like 30s, 15m, 12h, 7d or 2w, not {value!r}"
                )
            age = timedelta(seconds=float(match[1]) * units.get(match[2] or "s", 1))
        else:
            raise ValueError(f"older_than must be a duration, not {type(value).__name__}")
    except OverflowError:
        age = MAX_DELAY * 2  # NaN and infinity raise ValueError above
    if age < timedelta(0) or age > MAX_DELAY:
        raise ValueError("older_than must be from 0 to 100 years")
    return age


def _prune_params(
    older_than: str | float | timedelta, statuses: Iterable[JobStatus | str], batch_size: int
) -> dict[str, Any]:
    names: list[str] = []
    for s in [statuses] if isinstance(statuses, str) else statuses:
        try:
            names.append(str(JobStatus(s)))
        except ValueError:
            raise ValueError(f"unknown job status {s!r}") from None
    bad = [s for s in names if s not in TERMINAL_STATUSES]
    if bad:
        raise ValueError(
            f"only finished jobs (completed, failed, cancelled) can be removed, "
            f"not {', '.join(bad)}"
        )
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    return {
        "statuses": names,
        "before": datetime.now().astimezone() - _parse_duration(older_than),
        "batch": batch_size,
    }


# -- waiting --------------------------------------------------------------------------------


class _DoneWaiters:
    """The waiters of one database, by job: one `worker_done` subscription on the process's
    notifier serves them all (threads and event loops alike), so a thousand waiters hold one
    listening connection, not a thousand.

    Each notification wakes the waiters of its job; a `None` from the notifier (it connected,
    reconnected or lost its connection) wakes every waiter, to recheck its job. The
    subscription is dropped when the last waiter leaves; the notifier keeps its connection
    a while for the next one.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._waiters: dict[str, dict[int, Callable[[], None]]] = {}
        self._tokens = itertools.count()
        self._subscription: Subscription | None = None

    @contextlib.contextmanager
    def waiting(self, job_id: str, wake: Callable[[], None]) -> Iterator[Subscription]:
        """Call `wake` (from the notifier's thread) whenever `job_id` may have changed; yields
        the subscription, whose `ready` is set while LISTEN is in place."""
        token = next(self._tokens)
        with self._lock:
            self._waiters.setdefault(job_id, {})[token] = wake
            if self._subscription is None:
                self._subscription = notifier(self.url, LISTENER_NAME).subscribe(
                    "worker_done", self._wake
                )
            subscription = self._subscription
        try:
            yield subscription
        finally:
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.pop(token, None)
                    if not waiters:
                        del self._waiters[job_id]
                if not self._waiters and self._subscription is not None:
                    self._subscription.close()
                    self._subscription = None

    def _wake(self, job_id: str | None) -> None:
        with self._lock:
            if job_id is None:
                targets = [w for ws in self._waiters.values() for w in ws.values()]
            else:
                targets = list(self._waiters.get(job_id, {}).values())
        for wake in targets:
            wake()


_done_waiters: dict[str, _DoneWaiters] = {}
_done_waiters_lock = threading.Lock()


def _waiters_of(url: str) -> _DoneWaiters:
    with _done_waiters_lock:
        found = _done_waiters.get(url)
        if found is None:
            found = _done_waiters[url] = _DoneWaiters(url)
        return found


def _forget_waiters() -> None:
    # A forked child inherits no waiter, and its notifier is its own.
    global _done_waiters_lock
    _done_waiters.clear()
    _done_waiters_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_waiters)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _pause(left: float | None) -> float:
    return WAIT_RECHECK_SECONDS if left is None else min(left, WAIT_RECHECK_SECONDS)


# -- the job handle -------------------------------------------------------------------------


@dataclass
class Job:
    """A handle on one job, valid in any process: from `enqueue(...)` or `Job.get(job_id)`.

    >>> job = Job.get("0b0e3c5e-6f0a-4c8e-9d55-0c1f2b7a9e11")   # doctest: +SKIP
    >>> job.refresh().status                                      # doctest: +SKIP
    <JobStatus.COMPLETED: 'completed'>
    """

    job_id: str
    task: str = ""
    status: JobStatus = JobStatus.PENDING
    queue: str = "default"
    payload: dict[str, JSON] = field(default_factory=dict)
    result: JSON = None
    error: str | None = None
    retry_count: int = 0
    max_retries: int | None = None
    priority: int = 0
    question: JSON = None
    answer: JSON = None
    cancel_requested: bool = False
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime | None = None
    stages: list[dict[str, JSON]] = field(default_factory=list)
    client: Client | AsyncClient | None = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.job_id

    @property
    def outputs(self) -> dict[str, JSON]:
        """Stage outputs by stage name (completed stages only)."""
        return {s["stage"]: s["output"] for s in self.stages if s["status"] == "completed"}

    @classmethod
    def get(cls, job_id: str | UUID) -> Job:
        """Read a job by id with the default client (`DATABASE_URL`), in any process.

        >>> Job.get(job_id).wait_sync(timeout=60)     # doctest: +SKIP
        """
        return default_client().get(job_id)

    def _client(self) -> Client:
        if isinstance(self.client, Client):
            return self.client
        if isinstance(self.client, AsyncClient):
            return Client(self.client.url)
        return default_client()

    def _url(self) -> str:
        return self.client.url if self.client is not None else default_client().url

    def _update(self, other: Job) -> Job:
        for name in self.__dataclass_fields__:
            if name != "client":
                setattr(self, name, getattr(other, name))
        return self

    def refresh(self) -> Job:
        """Re-read the job from the database (blocking); returns the handle itself."""
        return self._update(self._client().get(self.job_id))

    async def _refresh_async(self) -> None:
        if isinstance(self.client, AsyncClient):
            self._update(await self.client.get(self.job_id))
        else:
            await asyncio.to_thread(self.refresh)

    def _outcome(self) -> JSON:
        if self.status == JobStatus.COMPLETED:
            return self.result
        if self.status == JobStatus.FAILED:
            raise JobFailed(self)
        if self.status == JobStatus.CANCELLED:
            raise JobCancelledError(self)
        return self.result  # timed out: still pending, processing or paused

    def wait_sync(self, timeout: float | None = None) -> JSON:
        """Block until the job finishes; return its result.

        Raises `JobFailed` or `JobCancelledError` (both `RuntimeError`, carrying the job's
        error) if it ended so. On timeout, returns without raising and the handle shows the
        current status: check `job.status`. A paused job is waited on until it is resumed
        and finishes (or the timeout passes).

        >>> job = enqueue("add", {"a": 1, "b": 2})    # doctest: +SKIP
        >>> job.wait_sync(timeout=30)                 # doctest: +SKIP
        3
        """
        deadline = _deadline(timeout)
        client = self._client()
        woken = threading.Event()
        with _waiters_of(client.url).waiting(self.job_id, woken.set) as listening:
            # LISTEN before the first read: a finish between the two is then never missed.
            ready_for = _left(deadline)
            listening.ready.wait(
                LISTEN_READY_SECONDS if ready_for is None else min(ready_for, LISTEN_READY_SECONDS)
            )
            while True:
                woken.clear()
                self._update(client.get(self.job_id))
                left = _left(deadline)
                if self.status.is_terminal or (left is not None and left <= 0):
                    return self._outcome()
                woken.wait(_pause(left))

    async def wait(self, timeout: float | None = None) -> JSON:
        """The async `wait_sync`: suspends the coroutine instead of blocking the thread.

        >>> result = await job.wait(timeout=30)       # doctest: +SKIP
        """
        deadline = _deadline(timeout)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: its waiter is gone
                loop.call_soon_threadsafe(woken.set)

        with _waiters_of(self._url()).waiting(self.job_id, wake) as listening:
            ready_for = _left(deadline)
            await listening.wait_ready(
                LISTEN_READY_SECONDS if ready_for is None else min(ready_for, LISTEN_READY_SECONDS)
            )
            while True:
                woken.clear()
                await self._refresh_async()
                left = _left(deadline)
                if self.status.is_terminal or (left is not None and left <= 0):
                    return self._outcome()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), _pause(left))

    def cancel(self) -> JobStatus:
        """Request cancellation; returns the status right after the request.

        A job that has not started is cancelled at once; a running one stops at its next
        stage boundary (or when its task checks `ctx.cancelled`), running its cleanup first.
        """
        status = self._client().cancel(self.job_id)
        self.status = status
        return status


def _job_from_row(row: Any, stages: Sequence[Any], client: Client | AsyncClient) -> Job:
    (
        job_id,
        queue,
        task,
        payload,
        status,
        priority,
        run_at,
        retry_count,
        max_retries,
        result,
        error,
        created_at,
        started_at,
        finished_at,
        _worker,
        cancel_requested,
        question,
        answer,
    ) = row
    return Job(
        job_id=str(job_id),
        task=task,
        status=JobStatus(status),
        queue=queue,
        payload=payload,
        result=result,
        error=error,
        retry_count=retry_count,
        max_retries=max_retries,
        priority=priority,
        question=question,
        answer=answer,
        cancel_requested=cancel_requested,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        run_at=run_at,
        stages=[
            {
                "stage": s[0],
                "kind": s[1],
                "status": s[2],
                "output": s[3],
                "error": s[4],
                "attempt": s[5],
                "started_at": s[6],
                "finished_at": s[7],
            }
            for s in stages
        ],
        client=client,
    )


def _cancel_result(job_id: str, row: Any) -> JobStatus:
    if row is None or row[0] is None:
        raise JobNotFound(f"no job {job_id}")
    before, after = row[0], row[1]
    if after is None:
        return JobStatus(before)  # already finished: nothing to cancel
    return JobStatus(after)


def _new_job(
    job_id: object, spec: JobSpec, client: Client | AsyncClient, run_at: datetime | None = None
) -> Job:
    return Job(
        job_id=str(job_id),
        task=spec.task,
        queue=spec.queue,
        payload=spec.payload,
        priority=spec.priority,
        max_retries=spec.max_retries,
        run_at=run_at,
        client=client,
    )


def _rows(result: Result[Any], returning: bool) -> list[Any]:
    return list(result.all()) if returning else []


# -- clients --------------------------------------------------------------------------------

SyncTarget = Connection | Session | None
AsyncTarget = AsyncConnection | AsyncSession | None


class Client:
    """Blocking client.

    `connection=` joins the caller's transaction (a SQLAlchemy `Connection` or `Session`, on
    the psycopg or asyncpg driver): the job then exists if and only if that transaction
    commits, and no worker sees it before.

    >>> client = Client()                                       # doctest: +SKIP
    >>> with engine.begin() as conn:                            # doctest: +SKIP
    ...     conn.execute(orders.insert().values(id=42))
    ...     client.enqueue("ship_order", {"order": 42}, connection=conn)
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = psycopg_url(url) if url else database_url()
        self.engine: Engine = sync_engine(self.url)
        # Each of our statements is atomic on its own: autocommit spares a BEGIN and a COMMIT
        # round trip per call.
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        # Enqueues outside a caller's transaction: one prepared statement, one round trip.
        self._direct = DirectWrites(self.url)
        self.max_payload_bytes = get_settings().max_payload_bytes

    def close(self) -> None:
        """Close the client's idle connections (it opens new ones if used again).

        >>> client.close()                                          # doctest: +SKIP
        """
        self._direct.close()
        self.engine.dispose()

    def _run(self, statement: str, params: dict[str, Any]) -> Any:
        with self._autocommit.connect() as conn:
            result = conn.exec_driver_sql(statement, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    def _insert(
        self,
        statement: str,
        again: str,
        params: dict[str, Any],
        connection: SyncTarget,
        returning: bool,
    ) -> list[Any]:
        if connection is None:
            return self._direct.run(statement, again, params)
        if isinstance(connection, Session | Connection):
            return _rows(connection.execute(_portable(statement), params), returning)
        raise TypeError(
            "connection= takes a SQLAlchemy Connection or Session "
            f"(AsyncClient takes the async ones), not {type(connection).__name__}"
        )

    def enqueue(
        self,
        task: str,
        payload: dict[str, JSON] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float | timedelta = 0.0,
        run_at: datetime | None = None,
        max_retries: int | None = None,
        connection: SyncTarget = None,
    ) -> Job:
        """Enqueue one job; returns its handle. Refused with `InvalidJob` before anything is
        written if the payload is not a JSON object or an option is out of range.

        >>> client.enqueue("send_email", {"to": "ada@example.com"}, delay=60)  # doctest: +SKIP
        """
        spec = JobSpec(
            task, {} if payload is None else payload, queue, priority, delay, run_at, max_retries
        )
        params = _validated(spec, self.max_payload_bytes)
        params["id"] = new_job_id()
        (row,) = self._insert(sql.ENQUEUE, sql.ENQUEUE_AGAIN, params, connection, True)
        return _new_job(row[0], spec, self, row[1])

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: SyncTarget = None,
    ) -> list[Job]:
        """Insert many jobs in one statement (one round trip); returns their handles in order.

        Every job is validated first: if one is bad, `InvalidJob` names its index and nothing
        is written. Idle workers are woken once per queue, not once per job.

        >>> client.enqueue_many([JobSpec("resize", {"id": i}) for i in range(50)])  # doctest: +SKIP
        """
        batch = _prepared_many(jobs, self.max_payload_bytes)
        if not batch.specs:
            return []
        rows = batch.copy_rows() if connection is None else None
        if rows is not None:
            self._direct.copy(sql.ENQUEUE_MANY_COPY, rows, sql.ENQUEUE_MANY_AGAIN, batch.params)
        else:
            self._insert(
                sql.ENQUEUE_MANY, sql.ENQUEUE_MANY_AGAIN, batch.params(), connection, False
            )
        return [_new_job(i, s, self) for i, s in zip(batch.ids, batch.specs, strict=True)]

    def get(self, job_id: str | UUID) -> Job:
        """The job's current state, with its stages; `JobNotFound` if there is no such job."""
        params = {"id": _job_id(job_id)}
        with self._autocommit.connect() as conn:
            row = conn.exec_driver_sql(sql.GET_JOB, params).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id}")
            stages = conn.exec_driver_sql(sql.GET_STAGES, params).fetchall()
        return _job_from_row(row, stages, self)

    def cancel(self, job_id: str | UUID) -> JobStatus:
        """Cancel a job: at once if it has not started, else at its next stage boundary.
        Returns the status after the request (a finished job's status is returned as is)."""
        (row,) = self._run(sql.CANCEL, {"id": _job_id(job_id)})
        return _cancel_result(str(job_id), row)

    def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        """Answer a paused job's question; it goes back to `pending`.

        >>> client.resume(job_id, {"approved": True})     # doctest: +SKIP
        """
        params = {
            "id": _job_id(job_id),
            "answer": _stored_json(answer, "answer", self.max_payload_bytes),
        }
        if not self._run(sql.RESUME, params):
            status = self.get(job_id).status
            raise InvalidTransition(f"job {job_id} is {status}, not paused: nothing to resume")
        return self.get(job_id)

    def retry(self, job_id: str | UUID) -> Job:
        """Run a failed or cancelled job again, with fresh retries."""
        if not self._run(sql.RETRY, {"id": _job_id(job_id)}):
            status = self.get(job_id).status
            raise InvalidTransition(
                f"job {job_id} is {status}: only failed or cancelled jobs can be retried"
            )
        return self.get(job_id)

    def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs that finished longer ago than `older_than` ("7d", "12h",
        seconds or a timedelta), with their stages and events. Each batch of `batch_size` is
        its own short transaction, so no lock is held for long. Returns how many were removed.

        >>> client.cleanup_jobs(older_than="30d", statuses=["completed"])   # doctest: +SKIP
        1200
        """
        params = _prune_params(older_than, statuses, batch_size)
        removed = 0
        while True:
            n: int = self._run(sql.PRUNE_BATCH, params)
            removed += n
            if n < batch_size:
                return removed


class AsyncClient:
    """The asyncio twin of `Client`, with the same verbs; `connection=` takes a SQLAlchemy
    `AsyncConnection` or `AsyncSession` (psycopg or asyncpg).

    >>> client = AsyncClient()                                          # doctest: +SKIP
    >>> async with async_session.begin() as session:                    # doctest: +SKIP
    ...     session.add(Order(id=42))
    ...     await client.enqueue("ship_order", {"order": 42}, connection=session)
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = psycopg_url(url) if url else database_url()
        self.engine: AsyncEngine = async_engine(self.url)
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._direct = AsyncDirectWrites(self.url)
        self.max_payload_bytes = get_settings().max_payload_bytes

    async def close(self) -> None:
        """Close the client's idle connections (it opens new ones if used again).

        >>> await client.close()                                    # doctest: +SKIP
        """
        await self._direct.close()
        await self.engine.dispose()

    async def _run(self, statement: str, params: dict[str, Any]) -> Any:
        async with self._autocommit.connect() as conn:
            result = await conn.exec_driver_sql(statement, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    async def _insert(
        self,
        statement: str,
        again: str,
        params: dict[str, Any],
        connection: AsyncTarget,
        returning: bool,
    ) -> list[Any]:
        if connection is None:
            return await self._direct.run(statement, again, params)
        if isinstance(connection, AsyncSession | AsyncConnection):
            return _rows(await connection.execute(_portable(statement), params), returning)
        raise TypeError(
            "connection= takes a SQLAlchemy AsyncConnection or AsyncSession "
            f"(Client takes the blocking ones), not {type(connection).__name__}"
        )

    async def enqueue(
        self,
        task: str,
        payload: dict[str, JSON] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: float | timedelta = 0.0,
        run_at: datetime | None = None,
        max_retries: int | None = None,
        connection: AsyncTarget = None,
    ) -> Job:
        """See `Client.enqueue`."""
        spec = JobSpec(
            task, {} if payload is None else payload, queue, priority, delay, run_at, max_retries
        )
        params = _validated(spec, self.max_payload_bytes)
        params["id"] = new_job_id()
        (row,) = await self._insert(sql.ENQUEUE, sql.ENQUEUE_AGAIN, params, connection, True)
        return _new_job(row[0], spec, self, row[1])

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
        *,
        connection: AsyncTarget = None,
    ) -> list[Job]:
        """See `Client.enqueue_many`."""
        batch = _prepared_many(jobs, self.max_payload_bytes)
        if not batch.specs:
            return []
        rows = batch.copy_rows() if connection is None else None
        if rows is not None:
            await self._direct.copy(
                sql.ENQUEUE_MANY_COPY, rows, sql.ENQUEUE_MANY_AGAIN, batch.params
            )
        else:
            await self._insert(
                sql.ENQUEUE_MANY, sql.ENQUEUE_MANY_AGAIN, batch.params(), connection, False
            )
        return [_new_job(i, s, self) for i, s in zip(batch.ids, batch.specs, strict=True)]

    async def get(self, job_id: str | UUID) -> Job:
        """See `Client.get`."""
        params = {"id": _job_id(job_id)}
        async with self._autocommit.connect() as conn:
            row = (await conn.exec_driver_sql(sql.GET_JOB, params)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id}")
            stages = (await conn.exec_driver_sql(sql.GET_STAGES, params)).fetchall()
        return _job_from_row(row, stages, self)

    async def cancel(self, job_id: str | UUID) -> JobStatus:
        """See `Client.cancel`."""
        (row,) = await self._run(sql.CANCEL, {"id": _job_id(job_id)})
        return _cancel_result(str(job_id), row)

    async def resume(self, job_id: str | UUID, answer: JSON = None) -> Job:
        """See `Client.resume`."""
        params = {
            "id": _job_id(job_id),
            "answer": _stored_json(answer, "answer", self.max_payload_bytes),
        }
        if not await self._run(sql.RESUME, params):
            status = (await self.get(job_id)).status
            raise InvalidTransition(f"job {job_id} is {status}, not paused: nothing to resume")
        return await self.get(job_id)

    async def retry(self, job_id: str | UUID) -> Job:
        """See `Client.retry`."""
        if not await self._run(sql.RETRY, {"id": _job_id(job_id)}):
            status = (await self.get(job_id)).status
            raise InvalidTransition(
                f"job {job_id} is {status}: only failed or cancelled jobs can be retried"
            )
        return await self.get(job_id)

    async def cleanup_jobs(
        self,
        older_than: str | float | timedelta = "7d",
        statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
        batch_size: int = 1000,
    ) -> int:
        """See `Client.cleanup_jobs`."""
        params = _prune_params(older_than, statuses, batch_size)
        removed = 0
        while True:
            n: int = await self._run(sql.PRUNE_BATCH, params)
            removed += n
            if n < batch_size:
                return removed


_default: Client | None = None


def default_client() -> Client:
    """The process-wide `Client` for `DATABASE_URL` (the embedded server when unset)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


def enqueue(task: str, payload: dict[str, JSON] | None = None, **options: Any) -> Job:
    """Enqueue a job with the default client; see `Client.enqueue`.

    >>> enqueue("resize_image", {"path": "a.png"}, queue="images", priority=5)  # doctest: +SKIP
    """
    return default_client().enqueue(task, payload, **options)


def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]], **options: Any
) -> list[Job]:
    """Enqueue many jobs in one round trip with the default client; see `Client.enqueue_many`.

    >>> enqueue_many([("add", {"a": i, "b": 1}) for i in range(1000)])   # doctest: +SKIP
    """
    return default_client().enqueue_many(jobs, **options)


def cancel(job_id: str | UUID) -> JobStatus:
    """Cancel a job with the default client; see `Client.cancel`."""
    return default_client().cancel(job_id)


def resume(job_id: str | UUID, answer: JSON = None) -> Job:
    """Resume a paused job with the operator's answer; see `Client.resume`."""
    return default_client().resume(job_id, answer)


def retry(job_id: str | UUID) -> Job:
    """Run a failed or cancelled job again; see `Client.retry`."""
    return default_client().retry(job_id)


def cleanup_jobs(
    older_than: str | float | timedelta = "7d",
    statuses: Iterable[JobStatus | str] = TERMINAL_STATUSES,
) -> int:
    """Delete finished jobs older than `older_than`; see `Client.cleanup_jobs`.

    >>> cleanup_jobs(older_than="7d")     # doctest: +SKIP
    42
    """
    return default_client().cleanup_jobs(older_than, statuses)
