"""Pipelines without a database: a runtime to run attempts in, over a `MemoryStageStore`.

For testing a pipeline's logic in-process: what each stage stores, what a retry runs again,
what a cancel or a lost worker leaves for the cleanups. `MemoryStageStore`
(`worker.db.memory_stages`) keeps the rules the daemon's store keeps on PostgreSQL, and
`run_attempt` plays the daemon's part around one attempt: it writes the stage end the outcome
carries and publishes the outcome's events after it, as the outcome write does.

    store = MemoryStageStore()
    runtime = MemoryRuntime(store)
    outcome = await run_attempt(pipeline, job, runtime)      # job: a `ClaimedJob`

What it does not do: claim, retry or rescue jobs (build the next attempt's `ClaimedJob`
yourself), hold writes to the attempt that holds the job (there is no other worker), or keep
anything once the process ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.db.memory_stages import MemoryStageStore
from worker.events import MemoryBus, ProgressBus
from worker.models import ClaimedJob, Outcome
from worker.tasks import Context

if TYPE_CHECKING:
    from worker.stages.pipeline import Pipeline


@dataclass
class MemoryRuntime:
    """What a pipeline runs with outside the daemon: a `MemoryBus`, a store, and threads."""

    store: MemoryStageStore = field(default_factory=MemoryStageStore)
    bus: ProgressBus = field(default_factory=MemoryBus)

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)


async def run_attempt(
    pipeline: Pipeline,
    job: ClaimedJob,
    runtime: MemoryRuntime,
    cancel: threading.Event | None = None,
) -> Outcome:
    """Run one attempt of `pipeline` for `job`, then write and report its outcome's stage end.

    `cancel`, when set, is a cancel request arriving while the attempt runs.
    """
    ctx = Context(job, runtime, cancel if cancel is not None else threading.Event())
    outcome = await pipeline.execute(ctx)
    runtime.store.record_outcome(job, outcome)
    for event in outcome.events:  # reported once the outcome is written
        runtime.bus.publish(event)
    return outcome
