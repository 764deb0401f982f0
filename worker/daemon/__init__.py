"""The worker daemon: the claim loop and its periodic duties (heartbeat, rescue, retention)."""

from worker.daemon.loop import Worker, next_poll_delay

__all__ = ["Worker", "next_poll_delay"]
