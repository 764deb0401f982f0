"""The worker's periodic duties, each a plugin: heartbeat, rescuer, retention.

A plugin has a `name` (the duty's name in the log) and a `run()` that loops until the worker
cancels it at shutdown. One that ends on an error stops the worker, loudly (see `Worker`).
A plugin that retries what an outage interrupts does so itself, logging below WARNING: the
worker's `Patience` reports outages once for everyone.

What this does not do: it does not schedule jobs; a plugin that enqueues (cron) is one more
of these.
"""

from __future__ import annotations

from typing import Protocol

from worker.daemon.plugins.heartbeat import Heartbeat
from worker.daemon.plugins.rescuer import Rescuer
from worker.daemon.plugins.retention import Retention


class Plugin(Protocol):
    """A periodic duty of the worker."""

    name: str

    async def run(self) -> None:
        """Do the duty until cancelled."""


__all__ = ["Heartbeat", "Plugin", "Rescuer", "Retention"]
