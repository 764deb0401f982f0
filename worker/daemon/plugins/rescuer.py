"""The rescuer: the jobs of dead workers go back to `pending`.

A worker is dead when the server ended its sessions (its process died) and it has not beaten
for `SESSION_GRACE` since that was seen: its jobs start again within seconds. Otherwise only
time tells: a worker that stalls longer than the lease (a frozen VM, a partition, a long
outage) loses its jobs to others, and its late results are discarded by the outcome guard.
The rule itself is one statement, `worker.db.sql.liveness.RESCUE`. Only a worker sure of its
own heartbeat judges others (`Heartbeat.sure_of_others`): after an outage every heartbeat is
stale, including the live workers'. A worker rescues once as it starts, then every half grace.

What this does not do: it does not run the rescued jobs; they are claimed like any other.
"""

from __future__ import annotations

import asyncio
import logging
import random

from worker.daemon.plugins.heartbeat import SESSION_GRACE, Heartbeat
from worker.db.driver import Driver
from worker.db.errors import TRANSIENT
from worker.logs import fields

log = logging.getLogger("worker.daemon")


class Rescuer:
    """Rescues the jobs of dead workers at start, then every half grace (jittered)."""

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

    async def rescue(self, starting: bool = False) -> int:
        # Judged again with a connection in hand: waiting for one may have outlasted an
        # outage, after which the other workers' heartbeats are not back yet.
        rescued = await self._driver.rescue(
            self._lease,
            SESSION_GRACE,
            lambda: self._heartbeat.sure_of_others(self._lease),
            starting,
        )
        for job in rescued:
            log.warning(
                "job %s (%s, queue %s) rescued: its worker was lost; back to pending",
                job.id,
                job.task,
                job.queue,
                extra=fields("job.rescued", job_id=job.id, task=job.task, queue=job.queue),
            )
        return len(rescued)

    async def run(self) -> None:
        interval = min(self._lease / 4, SESSION_GRACE / 2)
        started = asyncio.get_running_loop().time()
        while True:
            starting = asyncio.get_running_loop().time() - started < 3 * SESSION_GRACE
            if self._heartbeat.sure_of_others(self._lease):
                try:
                    await self.rescue(starting)
                except TRANSIENT as exc:
                    log.debug("rescue skipped: %s", type(exc).__name__)
            await asyncio.sleep(interval * (0.75 + random.random() / 2))
