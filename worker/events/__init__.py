"""The progress bus: a port with two adapters.

`MemoryBus` keeps events in this process (tests, single-process use). `PostgresBus` stores
them in `worker.job_events` and sends a NOTIFY per flush, so an API in another process (or on
another machine) streams what a worker publishes; `worker run` uses it by default.

The contract every adapter keeps:
- `publish` never blocks and never raises: a slow or absent bus must not slow or fail a job
  (under pressure an adapter drops the oldest unsent events and counts them);
- ids only grow, and a reader that resumes after the last id it saw misses nothing and sees
  nothing twice;
- events go when their job goes (retention, `worker prune`).

    bus = PostgresBus(url)                  # or MemoryBus()
    await bus.start()
    bus.publish(ProgressEvent(job_id=job_id, step="export", status="progress",
                              message={"pct": 40, "rows": 4000}))
    async for event in bus.follow(job_id, after=last_seen_id):
        ...
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from worker.events.memory import MemoryBus
from worker.events.postgres import PostgresBus
from worker.models import ProgressEvent


class ProgressBus(Protocol):
    """What the stage runner publishes to and the HTTP edge reads from."""

    def publish(self, event: ProgressEvent) -> None:
        """Queue an event for delivery; thread-safe, never blocks, never raises."""

    async def history(self, job_id: str, after: int = 0) -> list[ProgressEvent]:
        """Events of a job with an id greater than `after`, oldest first."""

    def follow(self, job_id: str, after: int = 0) -> AsyncGenerator[ProgressEvent, None]:
        """Past events after `after`, then new ones as they are published (never ends)."""

    async def start(self) -> None: ...

    async def aclose(self) -> None:
        """Deliver what is queued, then release resources."""


__all__ = ["MemoryBus", "PostgresBus", "ProgressBus"]
