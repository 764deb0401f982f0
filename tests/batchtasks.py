"""Tasks the batch tests run in real worker processes.

A callback records each run in the `effects` table with how many jobs of its batch were not
committed as ended when it started, so a test sees that it ran once, and never too early; it
returns the outcomes it read, counted.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import psycopg
from support.recording import task_connection

from worker import task

# Held by a test while the jobs of a batch pile up: each waits for it, so all of them end at
# the same moment once the test lets go.
GATE = 4344


@task
async def item(payload: dict[str, Any]) -> dict[str, int]:
    if payload.get("gate"):
        # On the event loop, not a thread: every slot of the worker can wait here at once.
        async with await psycopg.AsyncConnection.connect(
            os.environ["DATABASE_URL"], autocommit=True
        ) as conn:
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE,))
    if payload.get("fail"):
        raise RuntimeError(f"item {payload['n']} failed")
    return {"n": int(payload["n"])}


@task
def summarize(payload: dict[str, Any], ctx: Any) -> dict[str, int]:
    ids = [p.job_id for p in ctx.parents]
    (unended,) = (
        task_connection()
        .execute(
            "SELECT count(*) FROM unnest(%s::uuid[]) AS p(id) JOIN worker.jobs AS j "
            "ON j.id = p.id WHERE j.status NOT IN ('completed', 'failed', 'cancelled')",
            (ids,),
        )
        .fetchone()
    )
    task_connection().execute(
        "INSERT INTO effects (job, kind) VALUES (%s, %s)", (ctx.job_id, f"ran:{unended}")
    )
    return asdict(ctx.parent_counts)
