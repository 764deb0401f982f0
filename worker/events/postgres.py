"""The PostgreSQL progress bus: events in `worker.job_events`, readers woken by NOTIFY.

Publishing appends to a bounded in-process buffer; a background task writes the buffer in one
statement every few milliseconds (one NOTIFY per job per flush). If the database is slow or
away, the buffer keeps the newest events and drops the oldest beyond its bound, counting them:
progress is best-effort, the job's own state is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator

import psycopg

from worker.db import sql
from worker.models import ProgressEvent

log = logging.getLogger("worker.events")


class PostgresBus:
    def __init__(self, url: str, *, max_buffer: int = 100_000, flush_interval: float = 0.05):
        self.url = url
        self.dropped = 0
        self._buffer: deque[ProgressEvent] = deque()
        self._max_buffer = max_buffer
        self._lock = threading.Lock()
        self._interval = flush_interval
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection | None = None  # type: ignore[type-arg]
        self._listener: asyncio.Task[None] | None = None
        self._followers: dict[str, set[asyncio.Event]] = {}
        self._closing = False

    # -- publishing -------------------------------------------------------------------------

    def publish(self, event: ProgressEvent) -> None:
        with self._lock:
            self._buffer.append(event)
            if len(self._buffer) > self._max_buffer:
                self._buffer.popleft()
                self.dropped += 1
            big = len(self._buffer) >= 500
        if big and self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake.set)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._flusher = asyncio.create_task(self._flush_forever(), name="events-flush")

    async def _flush_forever(self) -> None:
        assert self._wake is not None
        backoff = 0.1
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            try:
                await self.flush()
                backoff = 0.1
            except (psycopg.Error, OSError) as exc:
                log.warning("progress events not written yet (%s); retrying", type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            if self._closing and not self._buffer:
                return

    async def flush(self) -> None:
        with self._lock:
            batch = list(self._buffer)
        if not batch:
            return
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await self._conn.execute(
            sql.PUBLISH_EVENTS,
            {
                "job_ids": [e.job_id for e in batch],
                "steps": [e.step for e in batch],
                "statuses": [e.status for e in batch],
                "messages": [
                    json.dumps(e.message) if e.message is not None else None for e in batch
                ],
                "created": [e.created_at for e in batch],
            },
        )
        with self._lock:
            # Only now forget them: a failed write keeps the batch for the next try.
            for _ in range(min(len(batch), len(self._buffer))):
                self._buffer.popleft()

    # -- reading ----------------------------------------------------------------------------

    async def history(self, job_id: str, after: int = 0) -> list[ProgressEvent]:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            return await self._read(conn, job_id, after)

    @staticmethod
    async def _read(
        conn: psycopg.AsyncConnection,  # type: ignore[type-arg]
        job_id: str,
        after: int,
    ) -> list[ProgressEvent]:
        cur = await conn.execute(sql.READ_EVENTS, {"job_id": job_id, "after": after, "limit": 1000})
        return [
            ProgressEvent(
                id=row[0],
                job_id=str(row[1]),
                step=row[2],
                status=row[3],
                message=row[4],
                created_at=row[5],
            )
            for row in await cur.fetchall()
        ]

    async def follow(self, job_id: str, after: int = 0) -> AsyncIterator[ProgressEvent]:
        """One shared LISTEN connection per bus wakes every follower of the job."""
        await self._ensure_listener()
        flag = asyncio.Event()
        self._followers.setdefault(job_id, set()).add(flag)
        try:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                while True:
                    flag.clear()
                    events = await self._read(conn, job_id, after)
                    for event in events:
                        after = event.id
                        yield event
                    if len(events) < 1000:
                        # A missed NOTIFY (a reconnect) costs at most a second of delay.
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(flag.wait(), 1.0)
        finally:
            followers = self._followers.get(job_id, set())
            followers.discard(flag)
            if not followers:
                self._followers.pop(job_id, None)

    async def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="events-listen")

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    await conn.execute("LISTEN worker_events")
                    async for note in conn.notifies():
                        for flag in self._followers.get(note.payload, ()):
                            flag.set()
            except (psycopg.Error, OSError):
                await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        self._closing = True
        if self._flusher is not None and self._wake is not None:
            self._wake.set()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._flusher, 5.0)
            self._flusher.cancel()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        if self._conn is not None:
            await self._conn.close()
