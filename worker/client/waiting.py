"""Waiting for a job to finish: who is woken when, and the one difference between a blocking
waiter and an asyncio one.

A worker sends `worker_done` with the job's id when it records an outcome. Every waiter of a
process shares one subscription per database on the process's notifier (one listening
connection), dispatched here to the waiters of each job; each waiter also rechecks its job
every `WAIT_RECHECK_SECONDS`, so a notification lost to a dropped connection delays it by at
most that long and never strands it. The wait loop itself is written once, in
`worker.client.wait_async` (and generated for blocking callers): it calls `Wake` or
`AsyncWake`, which hold the only difference, a `threading.Event` or an `asyncio.Event`.

This does not read jobs: the loop is given how to read one (`Get`, `AsyncGet`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from worker.db.notifier import LINGER_SECONDS, Subscription, notifier
from worker.models import JSON, JobStatus

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


class Watched(Protocol):
    """What the wait loop needs of the handle of the job it waits on: its id and status,
    taking a fresh read of the job, and its outcome."""

    job_id: str
    status: JobStatus

    def update(self, other: Any) -> object: ...

    def outcome(self) -> JSON: ...


# How a waiter reads its job afresh: a client's `get`, blocking or awaited.
Get = Callable[[str], Watched]
AsyncGet = Callable[[str], Awaitable[Watched]]


class DoneWaiters:
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


_done_waiters: dict[str, DoneWaiters] = {}


def done_waiters(url: str) -> DoneWaiters:
    """The process's waiters of the database at `url` (made on first use)."""
    found = _done_waiters.get(url)
    if found is None:  # `setdefault` is atomic: two threads that both missed get one value
        found = _done_waiters.setdefault(url, DoneWaiters(url))
    return found


# A forked child inherits no waiter, and its notifier is its own.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_done_waiters.clear)


class Wake:
    """A blocking waiter's wake-up call, set from the notifier's thread."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float) -> None:
        """Return once woken, or after `timeout` seconds."""
        self._event.wait(timeout)

    def ready(self, subscription: Subscription, timeout: float) -> None:
        """Return once LISTEN is in place, or after `timeout` seconds."""
        subscription.ready.wait(timeout)


class AsyncWake:
    """`Wake` for a coroutine: the notifier's thread sets it on the waiter's event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: its waiter is gone
            self._loop.call_soon_threadsafe(self._event.set)

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> None:
        """Return once woken, or after `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)

    async def ready(self, subscription: Subscription, timeout: float) -> None:
        """Return once LISTEN is in place, or after `timeout` seconds."""
        await subscription.wait_ready(timeout)


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic time a wait of `timeout` seconds ends (None: never)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        raise ValueError(f"timeout must be a number of seconds or None, not {timeout!r}")
    return time.monotonic() + timeout


def time_left(deadline: float | None) -> float | None:
    """Seconds until `deadline` (None: no deadline)."""
    return None if deadline is None else deadline - time.monotonic()


def ready_for(deadline: float | None) -> float:
    """How long to let the listener get ready: `LISTEN_READY_SECONDS`, within the deadline."""
    left = time_left(deadline)
    return LISTEN_READY_SECONDS if left is None else min(left, LISTEN_READY_SECONDS)


def pause(left: float | None) -> float:
    """How long to sleep before the next recheck, within what is left of the wait."""
    return WAIT_RECHECK_SECONDS if left is None else min(left, WAIT_RECHECK_SECONDS)
