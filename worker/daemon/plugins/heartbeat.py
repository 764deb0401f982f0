"""The heartbeat: this worker's lease, renewed, and cancel requests picked up.

One row in `worker.workers` per worker, not one per job: renewing it is the lease on every
job the worker holds. A worker presumed dead meanwhile (its row is gone) registers again. As
a fallback for a lost NOTIFY, each beat also picks up the cancel requests of the jobs it holds.
The beats' run tells the rescuer whether this worker has itself been reachable long enough
to judge others (`sure_of_others`).

It beats at least twice per `SESSION_GRACE`: a worker whose sessions the server ended (a
killed backend) but whose process lives beats again within the grace, so that rescuers tell
it from a dead one (`worker.db.sql.liveness`).

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

# Seconds a worker whose sessions ended has to beat again before it is presumed dead.
SESSION_GRACE = 1.0


class Heartbeat:
    """Renews the worker's lease every lease/3 seconds, or twice per grace if sooner."""

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
        self.interval = min(lease / 3, SESSION_GRACE / 2)
        # A beat later than this breaks the run of good beats: the lease's, not the interval's,
        # so that a slow beat on a busy machine does not stop the rescuer for a whole lease.
        self._late = 2 * lease / 3
        # The cancel requests' fallback is looked for every lease/3, not at every beat.
        self._cancels_every = lease / 3
        self._cancels_looked: float | None = None
        self._on_cancel = on_cancel
        self.healthy_since: float | None = None  # start of the current run of good beats
        self.first_ok: float | None = None
        self.last_ok: float | None = None

    async def beat(self) -> None:
        loop = asyncio.get_running_loop()
        looked = self._cancels_looked
        cancels = looked is None or loop.time() - looked >= self._cancels_every
        try:
            beat = await self._driver.heartbeat(self._registration, self._presumed_dead, cancels)
        except TRANSIENT:
            self.healthy_since = None
            raise
        for job_id in beat.cancel_requested:
            self._on_cancel(job_id)
        now = loop.time()
        if cancels:
            self._cancels_looked = now
        # A beat that hung through an outage and then went through still breaks the run.
        if self.healthy_since is None or self.last_ok is None or now - self.last_ok > self._late:
            self.healthy_since = now
        if self.first_ok is None:
            self.first_ok = now
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
            and now - self.last_ok <= self._late
        )

    def sure_of_others(self, lease: float) -> bool:
        """True if this worker may judge others dead: its beats went through for a whole
        lease, or every beat since it started did (a worker started after the rest of the
        fleet died rescues their jobs at once; one back from an outage waits a lease, since
        the others' heartbeats stalled in the same outage)."""
        return self.healthy_for(lease) or (
            self.healthy_since is not None
            and self.healthy_since == self.first_ok
            and self.healthy_for(0.0)
        )

    async def run(self) -> None:
        pause = self.interval
        while True:
            await asyncio.sleep(pause)
            try:
                await self.beat()
                pause = self.interval
            except TRANSIENT as exc:
                log.debug("heartbeat failed: %s", type(exc).__name__)
                # At once on a fresh session: a worker whose sessions were cut must beat again
                # within the grace, or rescuers take it for dead.
                pause = 0.05
