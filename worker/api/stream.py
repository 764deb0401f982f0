"""A job's progress as Server-Sent Events: the past first, then live, then the end.

Each event goes out with its bus id as the SSE `id:`, so a client that reconnects with
`Last-Event-ID` (browsers' `EventSource` do it on their own) gets exactly the events after the
last one it saw: the bus reads by `id > last`, and ids of one job only grow (see
`sql.PUBLISH_EVENTS`).

When the stream ends: right after the stage runner's final event (step `job`, status
`completed`, `failed` or `cancelled`) once the job row agrees it is finished; or, for a job
that never sends one (a plain task, a job cancelled before it started), a short grace after
the row is finished, so events still on their way are delivered; or when the job is deleted.
A failed event of a job that was retried since does not end the stream. The last message is an
`end` event (no id) carrying the final status, so a client knows not to reconnect.

What this does not do: it does not read events itself (the bus does) nor decide who may
listen (every read of the API is open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from worker.api.schemas import StreamEnd
from worker.events import ProgressBus
from worker.models import TERMINAL_STATUSES, JobStatus, ProgressEvent

log = logging.getLogger("worker.api")

# How long a finished job's stream waits for events still on their way (a worker flushes its
# events on a short timer, or when the database is back), when no final event closes it first.
END_GRACE_SECONDS = 2.0
# How often an idle stream re-reads the job's status, and sends a comment so proxies and the
# server notice a client that went away.
STATUS_RECHECK_SECONDS = 1.0
KEEPALIVE_SECONDS = 10.0
RECONNECT_MILLISECONDS = 2000
FINAL_STEP = "job"

StatusReader = Callable[[str], Awaitable[JobStatus | None]]


def format_event(event: ProgressEvent) -> str:
    """One SSE message; the JSON has no raw newline, so one `data:` line holds it."""
    return f"id: {event.id}\ndata: {event.model_dump_json()}\n\n"


def format_end(job_id: str, status: JobStatus | None) -> str:
    body = StreamEnd(job_id=job_id, status=status).model_dump_json()
    return f"event: end\ndata: {body}\n\n"


def is_final(event: ProgressEvent) -> bool:
    return event.step == FINAL_STEP and event.status in TERMINAL_STATUSES


async def _pump(
    bus: ProgressBus,
    job_id: str,
    after: int,
    queue: asyncio.Queue[ProgressEvent | BaseException],
) -> None:
    try:
        async with contextlib.aclosing(bus.follow(job_id, after)) as events:
            async for event in events:
                await queue.put(event)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # handed to the stream, which ends; the client resumes later
        await queue.put(exc)


async def job_event_stream(
    bus: ProgressBus, job_id: str, after: int, status_of: StatusReader
) -> AsyncIterator[str]:
    """The SSE body for one job, starting after event id `after`."""
    yield f"retry: {RECONNECT_MILLISECONDS}\n\n"
    queue: asyncio.Queue[ProgressEvent | BaseException] = asyncio.Queue(maxsize=1000)
    pump = asyncio.create_task(_pump(bus, job_id, after, queue), name=f"sse-{job_id}")
    final_seen = False
    finished_since: float | None = None
    last_sent = time.monotonic()
    last_check = 0.0
    try:
        while True:
            wait = 0.2 if final_seen else STATUS_RECHECK_SECONDS
            try:
                item: ProgressEvent | BaseException | None = await asyncio.wait_for(
                    queue.get(), wait
                )
            except TimeoutError:
                item = None
            if isinstance(item, BaseException):
                log.warning(
                    "event stream of job %s interrupted (%s); the client will resume",
                    job_id,
                    type(item).__name__,
                )
                return
            now = time.monotonic()
            if item is not None:
                yield format_event(item)
                last_sent = now
                final_seen = is_final(item)
                if not final_seen and now - last_check < STATUS_RECHECK_SECONDS:
                    continue
            last_check = now
            try:
                status = await status_of(job_id)
            except Exception as exc:  # the database went away: end; the client resumes later
                log.warning(
                    "event stream of job %s interrupted (%s); the client will resume",
                    job_id,
                    type(exc).__name__,
                )
                return
            if status is None:
                yield format_end(job_id, None)  # deleted (retention, or by an operator)
                return
            if status.is_terminal:
                if final_seen:
                    yield format_end(job_id, status)
                    return
                if finished_since is None:
                    finished_since = now
                elif now - finished_since >= END_GRACE_SECONDS and queue.empty():
                    yield format_end(job_id, status)
                    return
            else:
                finished_since = None
            if now - last_sent >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_sent = now
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
