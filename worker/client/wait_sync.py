# Generated from worker/client/wait_async.py by scripts/unasync.py: do not edit.
"""`wait_done`, the loop behind `Job.wait_sync`.

Generated from `worker.client.wait_async`, the one implementation: see it for what it
does, and edit it (then run `python scripts/unasync.py`), not this file.
"""

from __future__ import annotations

from worker.client.waiting import (
    Get,
    Wake,
    Watched,
    done_waiters,
    pause,
    ready_for,
    time_left,
)
from worker.models import JSON


def wait_done(job: Watched, get: Get, url: str, deadline: float | None) -> JSON:
    """Wait until `job` finishes or `deadline` (monotonic) passes, reading it with `get`;
    returns its result, or raises as `Job.outcome` does."""
    wake = Wake()
    with done_waiters(url).waiting(job.job_id, wake.set) as listening:
        # LISTEN before the first read: a finish between the two is then never missed.
        wake.ready(listening, ready_for(deadline))
        while True:
            wake.clear()
            job.update(get(job.job_id))
            left = time_left(deadline)
            if job.status.is_terminal or (left is not None and left <= 0):
                return job.outcome()
            wake.wait(pause(left))
