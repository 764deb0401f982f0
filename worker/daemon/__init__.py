"""The worker daemon: the claim loop and its periodic duties (heartbeat, rescue, retention)."""

from worker.daemon.loop import DutyFailed, Worker, next_poll_delay

__all__ = ["DutyFailed", "Worker", "next_poll_delay"]
