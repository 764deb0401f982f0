"""The daemon's periodic duties, each a small component with its own loop.

- `Heartbeat` renews this worker's lease (one row in `worker.workers`, not one per job) and,
  as a fallback for a lost NOTIFY, picks up cancel requests for the jobs it holds.
- `Rescuer` puts the jobs of workers silent for a whole lease back to `pending`. Rescue is
  purely based on time: a worker that stalls longer than the lease (a frozen VM, a long outage)
  loses its jobs to others, and its late results are discarded by the outcome guard.
- `Retention` deletes finished jobs older than the retention period, in small batches.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from worker.db.driver import Driver, Registration
from worker.db.postgres import TRANSIENT, describe
from worker.logs import fields
from worker.models import TERMINAL_STATUSES
from worker.settings import Settings

log = logging.getLogger("worker.daemon")


class Heartbeat:
    def __init__(
        self,
        driver: Driver,
        registration: Registration,
        lease: float,
        on_cancel: Callable[[str], None],
    ) -> None:
        self._driver = driver
        self._id = registration.id
        self._registration = registration
        self.interval = lease / 3
        self._on_cancel = on_cancel
        self.healthy_since: float | None = None  # start of the current run of good beats
        self.last_ok: float | None = None

    async def beat(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            beat = await self._driver.heartbeat(self._registration)
        except TRANSIENT:
            self.healthy_since = None
            raise
        if beat.registered_again:
            log.warning(
                "worker %s was presumed dead by another worker; its jobs may run "
                "again elsewhere; registering again",
                self._id,
                extra=fields("worker.reregistered", worker_id=self._id),
            )
        for job_id in beat.cancel_requested:
            self._on_cancel(job_id)
        now = loop.time()
        # A beat that hung through an outage and then went through still breaks the run.
        if (
            self.healthy_since is None
            or self.last_ok is None
            or now - self.last_ok > 2 * self.interval
        ):
            self.healthy_since = now
        self.last_ok = now

    def healthy_for(self, seconds: float) -> bool:
        """True if every beat for `seconds` went through and the last one is recent."""
        now = asyncio.get_running_loop().time()
        return (
            self.healthy_since is not None
            and self.last_ok is not None
            and now - self.healthy_since >= seconds
            and now - self.last_ok <= 2 * self.interval
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except TRANSIENT as exc:
                log.debug("heartbeat failed: %s", type(exc).__name__)


class Rescuer:
    def __init__(
        self,
        driver: Driver,
        heartbeat: Heartbeat,
        lease: float,
    ) -> None:
        self._driver = driver
        self._heartbeat = heartbeat
        self._lease = lease

    async def rescue(self) -> int:
        # Judged again with a connection in hand: waiting for one may have outlasted an
        # outage, after which the other workers' heartbeats are not back yet.
        rescued = await self._driver.rescue(
            self._lease, lambda: self._heartbeat.healthy_for(self._lease)
        )
        for job in rescued:
            log.warning(
                "job %s (%s, queue %s) rescued: its worker stopped heartbeating; back to pending",
                job.id,
                job.task,
                job.queue,
                extra=fields("job.rescued", job_id=job.id, task=job.task, queue=job.queue),
            )
        return len(rescued)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 4 * (0.75 + random.random() / 2))
            # Only a worker that has itself been reachable for a whole lease may judge others:
            # after an outage every heartbeat is stale, including the live workers'.
            if not self._heartbeat.healthy_for(self._lease):
                continue
            try:
                await self.rescue()
            except TRANSIENT as exc:
                log.debug("rescue skipped: %s", type(exc).__name__)


class Retention:
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
                    pruned = await self._driver.prune(sorted(TERMINAL_STATUSES), before, 1000)
                    removed += pruned
                    if pruned < 1000:
                        break
                if removed:
                    log.info(
                        "retention removed %d finished jobs",
                        removed,
                        extra=fields("retention.pruned", removed=removed),
                    )
            except TRANSIENT as exc:
                log.debug("retention skipped: %s", type(exc).__name__)
            except psycopg.Error as exc:  # housekeeping: jobs still run; the operator is told
                error = describe(exc)
                log.error(
                    "retention failed (%s); trying again next time",
                    error,
                    extra=fields("retention.failed", error=error),
                )
