"""The heartbeat: this worker's lease, renewed, and cancel requests picked up.

One row in `worker.workers` per worker, not one per job: renewing it is the lease on every
job the worker holds. A worker presumed dead meanwhile (its row is gone) registers again. As
a fallback for a lost NOTIFY, each beat also picks up the cancel requests of the jobs it holds.
The beats' run tells the rescuer whether this worker has itself been reachable long enough
to judge others (`healthy_for`).

What this does not do: it does not rescue anything (`rescuer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from worker.db.driver import Driver, Registration
from worker.db.errors import TRANSIENT
from worker.logs import fields

log = logging.getLogger("worker.daemon")


class Heartbeat:
    """Renews the worker's lease every lease/3 seconds; see the module's docs."""

    name = "heartbeat"

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
            beat = await self._driver.heartbeat(self._registration, self._presumed_dead)
        except TRANSIENT:
            self.healthy_since = None
            raise
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

    def _presumed_dead(self) -> None:
        log.warning(
            "worker %s was presumed dead by another worker; its jobs may run "
            "again elsewhere; registering again",
            self._id,
            extra=fields("worker.reregistered", worker_id=self._id),
        )

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
