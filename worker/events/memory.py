"""The in-memory progress bus: events live in this process only.

For tests and for single-process use (a worker and the HTTP edge in one process, a script that
runs jobs in-process and shows their progress). Events published here are invisible to other
processes: use `PostgresBus` when the API runs elsewhere.

    bus = MemoryBus()
    worker = Worker(url, settings, bus=bus)     # the worker publishes here
    app = create_app(url, token, bus=bus)       # and the API streams from here
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator

from worker.models import ProgressEvent


class MemoryBus:
    """Per-process bus. Readers on any event loop are woken when an event arrives.

    Ids increase by one per publish across all jobs. Memory is bounded: a job keeps its newest
    `max_events_per_job` events, and only the `max_jobs` jobs that published most recently are
    kept (the oldest job's events go first, as retention removes old jobs from the database).

    >>> bus = MemoryBus()
    >>> bus.publish(ProgressEvent(job_id="j1", step="load", status="started"))
    >>> import asyncio; [e.id for e in asyncio.run(bus.history("j1"))]
    [1]
    """

    def __init__(self, max_events_per_job: int = 10_000, max_jobs: int = 10_000) -> None:
        self._events: OrderedDict[str, list[ProgressEvent]] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._max = max_events_per_job
        self._max_jobs = max_jobs

    def publish(self, event: ProgressEvent) -> None:
        """Store the event with the next id and wake every reader; never blocks on readers."""
        with self._lock:
            event = event.model_copy(update={"id": next(self._ids)})
            events = self._events.get(event.job_id)
            if events is None:
                events = self._events[event.job_id] = []
                while len(self._events) > self._max_jobs:
                    self._events.popitem(last=False)
            else:
                self._events.move_to_end(event.job_id)
            events.append(event)
            if len(events) > self._max:
                del events[: len(events) - self._max]
            waiters = list(self._waiters)
        for loop, flag in waiters:
            try:
                loop.call_soon_threadsafe(flag.set)
            except RuntimeError:  # that loop is closed; its reader is gone
                with self._lock:
                    self._waiters.discard((loop, flag))

    async def history(self, job_id: str, after: int = 0) -> list[ProgressEvent]:
        with self._lock:
            return [e for e in self._events.get(job_id, ()) if e.id > after]

    async def follow(self, job_id: str, after: int = 0) -> AsyncGenerator[ProgressEvent, None]:
        flag = asyncio.Event()
        key = (asyncio.get_running_loop(), flag)
        with self._lock:
            self._waiters.add(key)
        try:
            while True:
                # Cleared before reading: an event published after the read sets it again.
                flag.clear()
                for event in await self.history(job_id, after):
                    after = event.id
                    yield event
                await flag.wait()
        finally:
            with self._lock:
                self._waiters.discard(key)

    def forget(self, job_id: str) -> None:
        """Drop a job's events (the in-memory counterpart of deleting the job)."""
        with self._lock:
            self._events.pop(job_id, None)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
