"""`wait_done`, the loop behind `Job.wait`: the one implementation of both wait loops.

`wait_done` in `worker.client.wait_sync`, the loop behind `Job.wait_sync`, is generated from
this file by `scripts/unasync.py`: edit here, then run it. What differs between the two lives
in `AsyncWake` and `Wake` (`worker.client.waiting`), never in this loop. It reads the job with
the `get` it is given, and knows no client.
"""

from __future__ import annotations

from worker.client.waiting import (
    AsyncGet,
    AsyncWake,
    Watched,
    done_waiters,
    pause,
    ready_for,
    time_left,
)
from worker.models import JSON


async def wait_done(job: Watched, get: AsyncGet, url: str, deadline: float | None) -> JSON:
    """Wait until `job` finishes or `deadline` (monotonic) passes, reading it with `get`;
    returns its result, or raises as `Job.outcome` does."""
    wake = AsyncWake()
    with done_waiters(url).waiting(job.job_id, wake.set) as listening:
        # LISTEN before the first read: a finish between the two is then never missed.
        await wake.ready(listening, ready_for(deadline))
        while True:
            wake.clear()
            job.update(await get(job.job_id))
            left = time_left(deadline)
            if job.status.is_terminal or (left is not None and left <= 0):
                return job.outcome()
            await wake.wait(pause(left))
