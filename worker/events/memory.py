"""The in-memory progress bus: events live in this process only."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict
from collections.abc import AsyncIterator

from worker.models import ProgressEvent


class MemoryBus:
    """Per-process bus. Readers on any event loop are woken when an event arrives."""

    def __init__(self, max_events_per_job: int = 10_000) -> None:
        self._events: dict[str, list[ProgressEvent]] = defaultdict(list)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._max = max_events_per_job

    def publish(self, event: ProgressEvent) -> None:
        with self._lock:
            event = event.model_copy(update={"id": next(self._ids)})
            events = self._events[event.job_id]
            events.append(event)
            if len(events) > self._max:
                del events[: len(events) - self._max]
            waiters = list(self._waiters)
        for loop, flag in waiters:
            try:
                loop.call_soon_threadsafe(flag.set)
            except RuntimeError:  # that loop is closed; its reader is gone
                self._waiters.discard((loop, flag))

    async def history(self, job_id: str, after: int = 0) -> list[ProgressEvent]:
        with self._lock:
            return [e for e in self._events.get(job_id, ()) if e.id > after]

    async def follow(self, job_id: str, after: int = 0) -> AsyncIterator[ProgressEvent]:
        flag = asyncio.Event()
        key = (asyncio.get_running_loop(), flag)
        self._waiters.add(key)
        try:
            while True:
                flag.clear()
                for event in await self.history(job_id, after):
                    after = event.id
                    yield event
                await flag.wait()
        finally:
            self._waiters.discard(key)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._events.pop(job_id, None)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
