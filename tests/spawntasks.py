"""Tasks the spawn tests run in real worker processes.

`fan_out` spawns one `square` child per part in its first stage (and, told to nest, a `fan_out`
child of its own), records how many of them were spawned before (a retried attempt finds them
all), and waits for them; its second stage reads their results. A part can be told to fail
(until the test fixes it), or to wait for a gate the test holds. `two_rounds` spawns and waits
in two stages in turn.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psycopg
from support.recording import task_connection

from worker import Pipeline, task

# Held by a test while it checks what a waiting spawner holds: gated children wait for it.
GATE = 4344


def record(job: str, kind: str) -> None:
    task_connection().execute("INSERT INTO effects (job, kind) VALUES (%s, %s)", (job, kind))


@task
async def square(payload: dict[str, Any], ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "ran")
    if payload.get("gate"):
        # On the event loop, not a thread: the worker's one slot waits here, not a thread.
        async with await psycopg.AsyncConnection.connect(
            os.environ["DATABASE_URL"], autocommit=True
        ) as conn:
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE,))
    if payload.get("fail") and not fixed(ctx.job_id):
        raise RuntimeError(f"part {payload['i']} failed")
    return {"square": int(payload["i"]) ** 2}


def fixed(job: str) -> bool:
    """Whether a test fixed this failing part before retrying it."""
    row = (
        task_connection()
        .execute("SELECT FROM effects WHERE job = %s AND kind = 'fix'", (job,))
        .fetchone()
    )
    return row is not None


def _unended(ids: list[str]) -> int:
    (n,) = (
        task_connection()
        .execute(
            "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s::uuid[]) "
            "AND status NOT IN ('completed', 'failed', 'cancelled')",
            (ids,),
        )
        .fetchone()
    )
    return int(n)


fan_out = Pipeline("fan_out")


@fan_out.stage
def split(ctx: Any) -> None:
    given = ctx.payload
    failing = set(given.get("fail", []))
    parts = {
        f"part-{i}": {"i": i, "fail": i in failing, "gate": given.get("gate", False)}
        for i in range(given["parts"])
    }
    # A part told to fail fails for good at once; the others are retried as usual (their
    # worker may be killed under them).
    children = ctx.spawn_many(square, parts, max_retries=0 if failing else None)
    if given.get("nest"):  # a child that spawns children of its own, and waits for them
        children += ctx.spawn_many("fan_out", {"inner": {"parts": given["nest"]}})
    found = sum(child.duplicate for child in children)
    record(ctx.job_id, f"spawned:{ctx.attempt}:{len(children)}:{found}")
    if given.get("die") and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # after the spawn committed, before the wait
    if given.get("wait_until_ended"):
        # The children end while this stage still runs: the wait then replays their outcomes.
        ids = [child.job_id for child in children]
        while _unended(ids):
            time.sleep(0.02)
    ctx.wait_for_children({"parts": len(children)})


@fan_out.stage
def gather(ctx: Any) -> dict[str, Any]:
    record(ctx.job_id, "gathered")
    children = ctx.children
    return {
        "split": ctx.outputs["split"],
        "keys": [c.key for c in children],
        "statuses": [c.status for c in children],
        "sum": sum(
            c.result.get("square", c.result.get("sum")) for c in children if c.status == "completed"
        ),
    }


@task
def spawns_one(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A plain task spawning twice with one key: the second finds the first's child."""
    first = ctx.spawn(square, {"i": 3}, key="only")
    again = ctx.spawn(square, {"i": 4}, key="only")
    return {"first": first.job_id, "again": again.job_id, "duplicate": again.duplicate}


@task
def waits_in_a_task(payload: dict[str, Any], ctx: Any) -> None:
    ctx.spawn(square, {"i": 1}, key="one")
    ctx.wait_for_children()


rounds = Pipeline("two_rounds")


@rounds.stage
def first_round(ctx: Any) -> None:
    ctx.spawn_many(square, {"a": {"i": 1}, "b": {"i": 2}})
    ctx.wait_for_children()


@rounds.stage
def second_round(ctx: Any) -> None:
    ended = [c.key for c in ctx.children]  # the first round's, all ended
    ctx.spawn_many(square, {"c": {"i": 3}, "d": {"i": 4}})
    ctx.wait_for_children({"ended_before": ended})


@rounds.stage
def total(ctx: Any) -> dict[str, Any]:
    return {
        "ended_before": ctx.outputs["second_round"]["ended_before"],
        "keys": [c.key for c in ctx.children],
        "sum": sum(c.result["square"] for c in ctx.children),
    }
