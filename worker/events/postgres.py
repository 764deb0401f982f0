"""The PostgreSQL progress bus: events in `worker.job_events`, readers woken by NOTIFY.

Publishing appends to a bounded in-process buffer and returns; a background task writes the
buffer in one statement every few milliseconds (one NOTIFY per job per flush). What this bus
promises, and what it does not:

- Ids are the table's sequence. Writers of one job's events are serialised (see
  `sql.PUBLISH_EVENTS`), so within a job a later-visible event always has a greater id: a
  reader that resumes after id N misses nothing.
- `publish` never blocks and never raises. If the database is slow or away, the buffer keeps
  the newest events and drops the oldest beyond its bound, counting them in `dropped`;
  progress is best-effort, the job's own state is not. An event of a job deleted meanwhile, or
  one the database refuses, is dropped on its own without holding up the others.
- Retention needs no work here: events go with their job (the trigger `jobs_deleted`).

    bus = PostgresBus(url)
    await bus.start()
    bus.publish(ProgressEvent(job_id=job_id, step="load", status="progress",
                              message={"pct": 40}))
    async for event in bus.follow(job_id):      # in another process, or on another machine
        print(event.id, event.step, event.status, event.message)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from worker.db.batcher import Batcher, Verdict
from worker.db.driver import EventWrite
from worker.db.errors import EVENTS_REFUSED
from worker.db.notifier import Subscription, notifier
from worker.db.postgres import LISTENER_NAME, PostgresDriver
from worker.logs import first_line
from worker.models import ProgressEvent

log = logging.getLogger("worker.events")

CHANNEL = "worker_events"
READ_LIMIT = 1000
# Events per INSERT. Building one statement's parameters runs on the worker's event loop: a
# backlog of tens of thousands in one statement would delay heartbeats past a short lease
# after the table was locked for a while. A backlog drains in chunks written back to back; the
# loop runs its other tasks between one chunk's statement and the next.
FLUSH_CHUNK = 2000
WAKE_AT = 500  # events waiting that start a flush before the interval is up
# A follower re-reads at least this often, so a NOTIFY lost during a reconnect costs at most
# this much delay, never an event.
FOLLOW_RECHECK_SECONDS = 1.0
# `\u0000` escapes not preceded by an escaped backslash: jsonb cannot store NUL.
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def message_json(message: dict[str, Any] | None) -> str | None:
    """A message as JSON text PostgreSQL accepts; never raises.

    Values JSON cannot hold become their `repr`, and NaN or NUL characters are replaced, so a
    careless `ctx.progress(obj=...)` still reports something instead of failing.

    >>> message_json({"pct": 50, "when": object})
    '{"pct": 50, "when": "<class \\'object\\'>"}'
    """
    if message is None:
        return None
    try:
        text = _encode_message(message)
    except (ValueError, TypeError, RecursionError):
        try:
            text = _encode_message(_finite(message))
        except (ValueError, TypeError, RecursionError) as exc:
            text = json.dumps({"unstorable_message": f"{type(exc).__name__}: {exc}"[:500]})
    return _NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


# One encoder for every message (`json.dumps` with options builds one per call).
_encode_message = json.JSONEncoder(default=repr, allow_nan=False).encode


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class PostgresBus:
    """The bus shared by every process on one database (the default with `worker run`)."""

    def __init__(
        self,
        url: str,
        *,
        max_buffer: int = 100_000,
        flush_interval: float = 0.05,
        read_pool_size: int = 4,
    ) -> None:
        self.url = url
        self.dropped = 0
        self._max_buffer = max_buffer
        self._lock = threading.Lock()
        self._flusher: asyncio.Task[None] | None = None
        # One connection writes, a small pool reads (opened on first use).
        self._driver = PostgresDriver(url, events_readers=read_pool_size)
        self._batcher: Batcher[EventWrite, None] = Batcher(
            self._write,
            judge=_judge,
            refuse=self._refused,
            max_batch=FLUSH_CHUNK,
            interval=flush_interval,
            wake_at=WAKE_AT,
            on_retry=_retrying,
            name="events-flush",
        )
        self._subscription: Subscription | None = None
        self._followers: dict[str, set[asyncio.Event]] = {}
        self._overflow_logged = 0.0

    # -- publishing -------------------------------------------------------------------------

    def publish(self, event: ProgressEvent) -> None:
        """Queue the event for the next flush; thread-safe, never blocks, never raises."""
        try:
            message = message_json(event.message)
        except Exception:  # a broken event must not fail the job that published it
            log.exception("progress event of job %s not publishable", event.job_id)
            return
        pending = EventWrite(event.job_id, event.step, event.status, message, event.created_at)
        if not self._batcher.add_threadsafe(pending, self._max_buffer):
            return
        with self._lock:
            self.dropped += 1
        if time.monotonic() - self._overflow_logged > 10:
            self._overflow_logged = time.monotonic()
            log.warning(
                "progress events are published faster than they can be written; "
                "dropping the oldest (%d dropped so far)",
                self.dropped,
            )

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._batcher.run(), name="events-flush")

    async def flush(self) -> None:
        """Write what is buffered now. A failed write keeps the batch for the next try."""
        await self._batcher.flush()

    async def _write(self, batch: list[EventWrite]) -> None:
        self._gone(batch, await self._driver.publish_events(batch))

    def _refused(self, item: EventWrite, exc: Exception) -> None:
        """One bad row must not hold back the rest: it is dropped alone."""
        self._dropped(1, f"job {item.job_id}", first_line(exc))

    def _gone(self, batch: list[EventWrite], jobs: list[str]) -> None:
        """Count the events the statement left out: their jobs no longer exist."""
        if jobs:
            gone = {uuid.UUID(job_id) for job_id in jobs}
            n = sum(1 for item in batch if uuid.UUID(item.job_id) in gone)
            which = ("job " if len(jobs) == 1 else "jobs ") + ", ".join(jobs)
            self._dropped(n, which, "no such job (deleted meanwhile?)")

    def _dropped(self, n: int, which: str, why: str) -> None:
        with self._lock:
            self.dropped += n
        what = "progress event" if n == 1 else f"{n} progress events"
        log.warning("%s of %s dropped: %s", what, which, why)

    # -- reading ----------------------------------------------------------------------------

    async def history(self, job_id: str, after: int = 0) -> list[ProgressEvent]:
        """Up to 1000 events of the job with an id greater than `after`, oldest first."""
        return await self._driver.read_events(job_id, after, READ_LIMIT)

    async def follow(self, job_id: str, after: int = 0) -> AsyncGenerator[ProgressEvent, None]:
        """Past events after `after`, then new ones as they are written; never ends.

        The process's notifier (one subscription per bus) wakes the followers of a job; the
        reads use a small pool, so a hundred followers do not hold a hundred connections.
        Database errors propagate: a caller resumes with the last id it saw.
        """
        self._subscribe()
        flag = asyncio.Event()
        self._followers.setdefault(job_id, set()).add(flag)
        try:
            while True:
                flag.clear()
                events = await self.history(job_id, after)
                for event in events:
                    after = event.id
                    yield event
                if len(events) < READ_LIMIT:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(flag.wait(), FOLLOW_RECHECK_SECONDS)
        finally:
            followers = self._followers.get(job_id, set())
            followers.discard(flag)
            if not followers:
                self._followers.pop(job_id, None)

    def _subscribe(self) -> None:
        if self._subscription is None:
            listener = notifier(self.url, LISTENER_NAME)
            self._subscription = listener.subscribe_async(CHANNEL, self._notified)

    def _notified(self, job_id: str | None) -> None:
        """Wake the followers of `job_id`; None (news may have been missed): every follower
        reads again."""
        if job_id is None:
            for flags in list(self._followers.values()):
                for flag in flags:
                    flag.set()
        else:
            for flag in self._followers.get(job_id, ()):
                flag.set()

    async def aclose(self) -> None:
        """Write what is buffered (for up to 5 s), then release the connections."""
        if self._flusher is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batcher.drain(), 5.0)
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self._batcher.pending:
            log.warning("%d progress events not written at shutdown", self._batcher.pending)
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None
        await self._driver.close()


def _judge(batch: list[EventWrite], exc: Exception, alone: bool) -> Verdict:
    # A refused event (a job deleted meanwhile, a value it cannot store) is dropped alone; any
    # other error keeps the batch for another try: progress waits out an outage.
    return Verdict.SPLIT if isinstance(exc, EVENTS_REFUSED) else Verdict.RETRY


def _retrying(exc: Exception, first: bool) -> None:
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "progress events not written yet (%s: %s); retrying",
        type(exc).__name__,
        first_line(exc),
    )
