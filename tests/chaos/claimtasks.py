"""The task of the claim-commit scenario, run by a real `worker run chaos.claimtasks` process.

It writes nothing until the test lets it go, so nothing the attempt does flushes the claim's
WAL to disk before the server is stopped; then it records the run with a token of its own
and returns that token, so the test can tell which run's outcome the job kept.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import psycopg

from worker import Context, task


def _record(job_id: str, attempt: int, token: float) -> None:
    # A connection per run: one kept from before the server's restart would be dead.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO chaos_effects (job, kind, attempt, pid, value) "
            "VALUES (%s, 'effect', %s, %s, %s)",
            (job_id, attempt, os.getpid(), token),
        )


@task
async def held_until_released(payload: dict[str, Any], ctx: Context) -> float:
    """Waits for the file `payload["release"]`, records this run, returns its token."""
    release = Path(payload["release"])
    while not release.exists():
        await asyncio.sleep(0.02)
    token = random.random()
    await asyncio.to_thread(_record, ctx.job_id, ctx.attempt, token)
    return token
