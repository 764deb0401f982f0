"""The rescuer: the jobs of workers silent for a whole lease go back to `pending`.

Rescue is purely based on time: a worker that stalls longer than the lease (a frozen VM, a
long outage) loses its jobs to others, and its late results are discarded by the outcome
guard. Only a worker whose own heartbeat has gone through for a whole lease judges others:
after an outage every heartbeat is stale, including the live workers'.

What this does not do: it does not run the rescued jobs; they are claimed like any other.
"""

from __future__ import annotations

import asyncio
import logging
import random

from worker.daemon.plugins.heartbeat import Heartbeat
from worker.db.driver import Driver
from worker.db.errors import TRANSIENT
from worker.logs import fields

log = logging.getLogger("worker.daemon")


class Rescuer:
    """Rescues the jobs of silent workers every lease/4 seconds, jittered."""

    name = "rescuer"

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
