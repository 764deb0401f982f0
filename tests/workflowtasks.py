"""Tasks the workflow tests run in real worker processes.

A child records each run in the `effects` table and, from its own connection, how many of its
parents were not committed as ended when it started: a test then sees that it ran once, and
never before the last parent's commit.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from support.recording import task_connection

from worker import task

# Held by a test while it lets parents pile up: each parent waits for it, so all of them
# finish at the same moment once the test lets go.
GATE = 4343


def record(job: str, kind: str) -> None:
    task_connection().execute("INSERT INTO effects (job, kind) VALUES (%s, %s)", (job, kind))


@task
async def part(payload: dict[str, Any]) -> dict[str, int]:
    if payload.get("gate"):
        # On the event loop, not a thread: every slot of the worker can wait here at once.
        async with await psycopg.AsyncConnection.connect(
            os.environ["DATABASE_URL"], autocommit=True
        ) as conn:
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE,))
    return {"n": int(payload["n"])}


@task
def fan_in(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ids = [p.job_id for p in ctx.parents]
    (unended,) = (
        task_connection()
        .execute(
            "SELECT count(*) FROM unnest(%s::uuid[]) AS p(id) LEFT JOIN worker.jobs AS j "
            "ON j.id = p.id WHERE j.status IS NULL OR j.status NOT IN "
            "('completed', 'failed', 'cancelled')",
            (ids,),
        )
        .fetchone()
    )
    record(ctx.job_id, f"ran:{unended}")
    completed = [ctx.result_of(p.node) for p in ctx.parents if p.status == "completed"]
    total = sum(int(r.get("n", 0)) for r in completed)
    return {"sum": total, "parents": [p.node for p in ctx.parents]}


@task
def boom(payload: dict[str, Any]) -> None:
    raise RuntimeError("boom")


@task
def finalize(payload: dict[str, Any], ctx: Any) -> dict[str, str]:
    record(ctx.job_id, "finalized")
    return {p.node or p.job_id: p.status for p in ctx.parents}


@task
def flaky(payload: dict[str, Any], ctx: Any) -> dict[str, int]:
    """Fails until the test records a fix for this job, so that a retry then completes."""
    (fixed,) = (
        task_connection()
        .execute("SELECT count(*) FROM effects WHERE job = %s AND kind = 'fix'", (ctx.job_id,))
        .fetchone()
    )
    if not fixed:
        raise RuntimeError("not fixed yet")
    return {"n": int(payload.get("n", 0))}
