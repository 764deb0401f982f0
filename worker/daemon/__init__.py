"""The worker daemon: the `Worker` and its parts (local queue, executor, completer, plugins)."""

from worker.daemon.local_queue import next_poll_delay
from worker.daemon.worker import DutyFailed, Worker

__all__ = ["DutyFailed", "Worker", "next_poll_delay"]
