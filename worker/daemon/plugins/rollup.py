"""The rollup: each minute's completed and failed jobs and each queue's depth, for the charts.

Every `INTERVAL` seconds (jittered) one worker of the fleet counts the recent outcomes again
from the rows and samples the depth of every queue into `worker.job_rollups` (see
`worker.db.sql.console`); the others find its turn taken and skip. At start it publishes its
registry's pipelines and their stages to `worker.task_stages`, so the console lists the
stages a job has yet to run, and each task's retry limit to `worker.task_limits`, so
`worker show` gives the limit a job gets. A failure is logged and tried again next time; on
a database without the rollup's migrations, that is said once.

What this does not do: it reads no history past the minutes it rolls up, and it changes no job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping

from worker.db.driver import Driver, StagePlans
from worker.db.errors import DATABASE_ERRORS, TRANSIENT, UNMIGRATED, describe
from worker.logs import fields
from worker.stages.pipeline import Pipeline
from worker.tasks import Executable

log = logging.getLogger("worker.daemon")

# Several runs per minute, so the current minute's depth is sampled a few times and a closed
# minute's outcomes are final within seconds.
INTERVAL = 15.0


def stage_plans(registry: Mapping[str, Executable]) -> StagePlans:
    """Each pipeline's stages and its cleanups (`ALL_DONE` stages), in the order they run."""
    return {
        name: ([s.name for s in entry.main_stages], [s.name for s in entry.cleanups])
        for name, entry in registry.items()
        if isinstance(entry, Pipeline)
    }


def task_limits(registry: Mapping[str, Executable], default: int) -> dict[str, int]:
    """The retry limit the claim applies to each task's jobs that set none of their own: the
    task's (or pipeline's) `max_retries`, else the worker's `default` (`sql.CLAIM` reads the
    same)."""
    return {
        name: default if entry.retries.max_retries is None else entry.retries.max_retries
        for name, entry in registry.items()
    }


class Rollup:
    """Writes the console's rollup now and then; see the module's docs."""

    name = "rollup"

    def __init__(
        self,
        driver: Driver,
        registry: Mapping[str, Executable],
        interval: float = INTERVAL,
        limits: Mapping[str, int] | None = None,
    ) -> None:
        self._driver = driver
        self._plans = stage_plans(registry)
        self._limits = limits or {}
        self.interval = interval
        self._published = False
        self._unmigrated = False

    async def once(self) -> bool:
        """One run: the stage lists if not yet, then the rollup; False if another had its turn."""
        if not self._published:
            await self._driver.publish_stage_plans(self._plans)
            if self._limits:
                await self._driver.publish_task_limits(self._limits)
            self._published = True
        return await self._driver.roll_up()

    async def run(self) -> None:
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            delay = self.interval * (0.5 + random.random())
            try:
                await self.once()
            except TRANSIENT as exc:
                log.debug("rollup skipped: %s", type(exc).__name__)
            except UNMIGRATED as exc:  # said once: the charts wait for `worker migrate`
                if not self._unmigrated:
                    self._unmigrated = True
                    log.warning(
                        "the console's charts are off until `worker migrate` adds their table (%s)",
                        describe(exc),
                        extra=fields("rollup.unmigrated", error=describe(exc)),
                    )
            except DATABASE_ERRORS as exc:  # the charts lag; jobs still run; the operator is told
                error = describe(exc)
                log.error(
                    "rollup failed (%s); trying again next time",
                    error,
                    extra=fields("rollup.failed", error=error),
                )
