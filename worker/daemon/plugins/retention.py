"""Retention: finished jobs older than the retention period are deleted, in small batches.

Runs every `WORKER_RETENTION_INTERVAL` seconds (jittered, so that workers do not prune
together); their events go with them. A failure is logged and tried again next time: jobs
still run meanwhile.

What this does not do: it does not touch live jobs (pending, processing, paused).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import UTC, datetime, timedelta

from worker.db.driver import Driver
from worker.db.errors import DATABASE_ERRORS, TRANSIENT, describe
from worker.logs import fields
from worker.models import TERMINAL_STATUSES
from worker.settings import Settings

log = logging.getLogger("worker.daemon")

PRUNE_BATCH = 1000  # jobs per statement: keeps each delete's locks short
# After each full batch, a rest as long as the batch took: a backlog of history is deleted on
# at most half of one connection's time, leaving the server to the jobs meanwhile.
PRUNE_REST = 1.0


class Retention:
    """Prunes finished jobs past the retention period, now and then."""

    name = "retention"

    def __init__(self, driver: Driver, settings: Settings) -> None:
        self._driver = driver
        self._settings = settings

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.retention_interval * (0.5 + random.random()))
            before = datetime.now(UTC) - timedelta(days=self._settings.retention_days)
            try:
                removed = 0
                while True:
                    began = time.monotonic()
                    pruned = await self._driver.prune(
                        sorted(TERMINAL_STATUSES), before, PRUNE_BATCH
                    )
                    removed += pruned
                    if pruned < PRUNE_BATCH:
                        break
                    await asyncio.sleep((time.monotonic() - began) * PRUNE_REST)
                if removed:
                    log.info(
                        "retention removed %d finished jobs",
                        removed,
                        extra=fields("retention.pruned", removed=removed),
                    )
            except TRANSIENT as exc:
                log.debug("retention skipped: %s", type(exc).__name__)
            except DATABASE_ERRORS as exc:  # housekeeping: jobs still run; the operator is told
                error = describe(exc)
                log.error(
                    "retention failed (%s); trying again next time",
                    error,
                    extra=fields("retention.failed", error=error),
                )
