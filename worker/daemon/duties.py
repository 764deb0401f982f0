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
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.daemon.db import TRANSIENT, describe
from worker.db import sql
from worker.logs import fields
from worker.models import TERMINAL_STATUSES
from worker.settings import Settings

log = logging.getLogger("worker.daemon")


class Heartbeat:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        worker_id: UUID,
        registration: dict[str, object],
        lease: float,
        on_cancel: Callable[[str], None],
    ) -> None:
        self._pool = pool
        self._id = worker_id
        self._registration = registration
        self.interval = lease / 3
        self._on_cancel = on_cancel
        self.healthy_since: float | None = None  # start of the current run of good beats
        self.last_ok: float | None = None

    async def beat(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.HEARTBEAT, {"id": self._id})
                if cur.rowcount == 0:
                    log.warning(
                        "worker %s was presumed dead by another worker; its jobs may run "
                        "again elsewhere; registering again",
                        self._id,
                        extra=fields("worker.reregistered", worker_id=self._id),
                    )
                    await conn.execute(sql.REGISTER_WORKER, self._registration)
                cur = await conn.execute(
                    "SELECT id::text FROM worker.jobs WHERE status = 'processing' "
                    "AND worker_id = %(id)s AND cancel_requested",
                    {"id": self._id},
                )
                for (job_id,) in await cur.fetchall():
                    self._on_cancel(job_id)
        except TRANSIENT:
            self.healthy_since = None
            raise
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
        pool: AsyncConnectionPool,
        heartbeat: Heartbeat,
        lease: float,
    ) -> None:
        self._pool = pool
        self._heartbeat = heartbeat
        self._lease = lease

    async def rescue(self) -> int:
        async with self._pool.connection() as conn:
            # Judged again with a connection in hand: waiting for one may have outlasted an
            # outage, after which the other workers' heartbeats are not back yet.
            if not self._heartbeat.healthy_for(self._lease):
                return 0
            cur = await conn.execute(sql.RESCUE, {"lease": self._lease})
            rows = await cur.fetchall()
        for job_id, task, queue, _ in rows:
            log.warning(
                "job %s (%s, queue %s) rescued: its worker stopped heartbeating; back to pending",
                job_id,
                task,
                queue,
                extra=fields("job.rescued", job_id=job_id, task=task, queue=queue),
            )
        return len(rows)

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
    def __init__(self, pool: AsyncConnectionPool, settings: Settings) -> None:
        self._pool = pool
        self._settings = settings

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.retention_interval * (0.5 + random.random()))
            before = datetime.now(UTC) - timedelta(days=self._settings.retention_days)
            try:
                removed = 0
                while True:
                    async with self._pool.connection() as conn:
                        cur = await conn.execute(
                            sql.PRUNE_BATCH,
                            {
                                "statuses": sorted(TERMINAL_STATUSES),
                                "before": before,
                                "batch": 1000,
                            },
                        )
                    removed += cur.rowcount
                    if cur.rowcount < 1000:
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
