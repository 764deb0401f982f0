"""The worker's periodic duties, each a plugin: heartbeat, rescuer, retention, scheduler.

A plugin has a `name` (the duty's name in the log) and a `run()` that loops until the worker
cancels it at shutdown. One that ends on an error stops the worker, loudly (see `Worker`).
A plugin that retries what an outage interrupts does so itself, logging below WARNING: the
worker's `Patience` reports outages once for everyone.

What this does not do: the plugins enqueue nothing but the scheduler's periodic jobs.
"""

from __future__ import annotations

from typing import Protocol

from worker.daemon.plugins.heartbeat import Heartbeat
from worker.daemon.plugins.rescuer import Rescuer
from worker.daemon.plugins.retention import Retention
from worker.daemon.plugins.scheduler import Scheduler


class Plugin(Protocol):
    """A periodic duty of the worker."""

    name: str

    async def run(self) -> None:
        """Do the duty until cancelled."""


__all__ = ["Heartbeat", "Plugin", "Rescuer", "Retention", "Scheduler"]
