"""The scheduler: a periodic task's job enqueued at each tick, once however many workers run.

Every worker with periodic tasks runs one. It sleeps until the soonest tick of its schedules
(it does not poll), then fires, for each schedule, each tick due since the last one it fired
(several, when it woke a few ticks late), through the driver's `fire_tick`: the database
takes each tick once, so the workers all firing it enqueue one job (see
`worker.db.sql.schedules`). At start, the latest tick due is fired: after a downtime that is
one catch-up job for the latest missed tick, whatever number were missed, and for a schedule
the database has never seen, none (it fires from its next tick on).

What this does not do: it does not make up ticks missed while no worker ran, nor more than
`LATE_TICKS` missed by a running worker (a stall, a long outage): one job stands for them
all. It does not run the jobs it enqueues; they are claimed like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from worker.db.backoff import Backoff
from worker.db.driver import Driver
from worker.db.errors import DATABASE_ERRORS, TRANSIENT, describe
from worker.logs import fields
from worker.schedules import Schedule

log = logging.getLogger("worker.daemon")

REFUSED_RETRY = 60.0  # seconds before a refused firing is tried again: an operator must act
# A running worker that wakes this many ticks late or fewer fires each; more is a stall, and
# the latest tick stands for them all, as after a downtime.
LATE_TICKS = 10


def _now() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    """Fires the ticks of `schedules` as they come; see the module's docs."""

    name = "scheduler"

    def __init__(
        self,
        driver: Driver,
        schedules: Sequence[Schedule],
        clock: Callable[[], datetime] = _now,
        fired: asyncio.Event | None = None,
    ) -> None:
        self._driver = driver
        # Set once the first firing is over, however it went: a drain waits for it.
        self.fired = fired if fired is not None else asyncio.Event()
        self._schedules = list(schedules)
        self._clock = clock
        self._taken: dict[str, datetime] = {}  # per key, the latest tick fired from here

    async def fire_due(self) -> list[str]:
        """Fire each schedule's latest tick due, if not fired from here yet; the new jobs'
        ids. A firing that fails (an outage, a refusal) is tried again next time; its error is
        raised once the other schedules have fired."""
        now, fired = self._clock(), []
        failed: Exception | None = None
        for schedule in self._schedules:
            for tick in self._due(schedule, now):
                try:
                    job_id = await self._driver.fire_tick(
                        schedule.key, schedule.task, schedule.spec, tick, schedule.queue
                    )
                except DATABASE_ERRORS as exc:  # the other schedules still fire; this one next time
                    failed = exc
                    break
                self._taken[schedule.key] = tick
                if job_id is None:
                    continue
                fired.append(job_id)
                log.info(
                    "scheduled job %s (%s) enqueued for %s",
                    job_id,
                    schedule.task,
                    tick.isoformat(),
                    extra=fields(
                        "schedule.fired",
                        job_id=job_id,
                        task=schedule.task,
                        queue=schedule.queue,
                        schedule=schedule.key,
                        tick=tick.isoformat(),
                    ),
                )
        if failed is not None:
            raise failed
        return fired

    def _due(self, schedule: Schedule, now: datetime) -> list[datetime]:
        """The ticks to fire now, oldest first: every tick since the last one fired from here
        (a wake-up that came late), or, at start or past `LATE_TICKS` of them (a downtime, a
        stall), the latest alone."""
        latest = schedule.latest_at_or_before(now)
        taken = self._taken.get(schedule.key)
        if taken is None:
            return [latest]
        ticks: list[datetime] = []
        tick = schedule.next_after(taken)
        while tick <= latest and len(ticks) <= LATE_TICKS:
            ticks.append(tick)
            tick = schedule.next_after(tick)
        return ticks if len(ticks) <= LATE_TICKS else [latest]

    def seconds_to_next_tick(self) -> float:
        """How long until the soonest tick of any schedule."""
        now = self._clock()
        soonest = min(schedule.next_after(now) for schedule in self._schedules)
        return max(0.0, (soonest - now).total_seconds())

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.fire_due()
            except TRANSIENT as exc:
                self.fired.set()
                log.debug("scheduled ticks not fired yet: %s", type(exc).__name__)
                await asyncio.sleep(backoff.next())
                continue
            except DATABASE_ERRORS as exc:  # a refusal (no table, no grant): jobs still run
                self.fired.set()
                error = describe(exc)
                log.error(
                    "scheduled ticks failed (%s); trying again in %.0f s",
                    error,
                    REFUSED_RETRY,
                    extra=fields("schedule.failed", error=error),
                )
                await asyncio.sleep(REFUSED_RETRY)
                continue
            self.fired.set()
            backoff.reset()
            # Asleep until the tick, not polling; a wake-up a little early finds nothing due
            # and sleeps again for the rest.
            await asyncio.sleep(self.seconds_to_next_tick())
