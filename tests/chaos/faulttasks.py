"""Tasks of the fault-injection tests, run by real `worker run chaos.faulttasks` processes.

Every task records its side effect in the `chaos_effects` table of the job's own database
(with the attempt and the process id), so a test counts how often each job really ran, across
kills, restarts and dropped connections.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from support.recording import task_connection

from worker import Context, Pipeline, task


def record(job_id: str, kind: str, attempt: int, value: float | None = None) -> None:
    """One row per side effect; raises (and the attempt is retried) while the database is away."""
    task_connection().execute(
        "INSERT INTO chaos_effects (job, kind, attempt, pid, value) VALUES (%s, %s, %s, %s, %s)",
        (job_id, kind, attempt, os.getpid(), value),
    )


@task
def chaos_sync(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    time.sleep(float(payload.get("sleep", 0)))
    record(ctx.job_id, "effect", ctx.attempt)
    return {"n": payload.get("n")}


@task
async def chaos_async(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    await asyncio.sleep(float(payload.get("sleep", 0)))
    await asyncio.to_thread(record, ctx.job_id, "effect", ctx.attempt)
    return {"n": payload.get("n")}


@task
async def timed_attempt(payload: dict[str, Any], ctx: Context) -> int:
    """Leaves a row when each attempt starts and one when it ends; returns its attempt."""
    await asyncio.to_thread(record, ctx.job_id, "start", ctx.attempt)
    await asyncio.sleep(float(payload.get("sleep", 0)))
    await asyncio.to_thread(record, ctx.job_id, "end", ctx.attempt)
    return ctx.attempt


# Two stages and an ALL_DONE cleanup: every stage run and every cleanup run leaves a row.
chaos_pipeline = Pipeline("chaos_pipeline")


@chaos_pipeline.stage
def fetch(ctx: Context) -> dict[str, Any]:
    time.sleep(float(ctx.payload.get("sleep", 0)) / 2)
    record(ctx.job_id, "stage:fetch", ctx.attempt)
    return {"n": ctx.payload.get("n")}


@chaos_pipeline.stage
def store(ctx: Context) -> dict[str, Any]:
    time.sleep(float(ctx.payload.get("sleep", 0)) / 2)
    record(ctx.job_id, "stage:store", ctx.attempt)
    return {"stored": ctx.outputs["fetch"]["n"]}


@chaos_pipeline.cleanup
def release(ctx: Context) -> str:
    record(ctx.job_id, "cleanup", ctx.attempt)
    return "released"


@task
def chatty(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Publishes `events` progress events; records the slowest single publish call."""
    slowest = 0.0
    for i in range(int(payload.get("events", 50))):
        started = time.perf_counter()
        ctx.progress(i, n=payload.get("n"))
        slowest = max(slowest, time.perf_counter() - started)
    time.sleep(float(payload.get("sleep", 0)))
    record(ctx.job_id, "effect", ctx.attempt, slowest)
    return {"slowest_publish": slowest}


@task(timeout=1.0)
async def slow_async(payload: dict[str, Any]) -> str:
    await asyncio.sleep(float(payload.get("sleep", 30)))
    return "should have timed out"


@task(timeout=1.0)
async def hands_off_to_a_thread(payload: dict[str, Any], ctx: Context) -> str:
    """Awaits a blocking helper in a thread of its own, which stops once told."""

    def helper() -> None:
        began = time.monotonic()
        while not ctx.cancelled and time.monotonic() - began < 20:
            time.sleep(0.05)
        record(ctx.job_id, "helper told" if ctx.cancelled else "helper not told", ctx.attempt)

    await asyncio.to_thread(helper)
    return "should have timed out"


@task(timeout=30.0)
def upstream_timeout(payload: dict[str, Any]) -> str:
    """Raises a TimeoutError of its own long before its job's timeout."""
    raise TimeoutError("the upstream did not answer")


@task(timeout=1.0)
def stuck_sync(payload: dict[str, Any], ctx: Context) -> str:
    """Ignores its cancel flag: a thread cannot be stopped from outside."""
    time.sleep(float(payload.get("sleep", 4)))
    record(ctx.job_id, "stuck_returned", ctx.attempt)
    return "returned late"


@task
def default_timeout_sync(payload: dict[str, Any]) -> str:
    """Has no timeout of its own: `WORKER_TASK_TIMEOUT` applies."""
    time.sleep(float(payload.get("sleep", 30)))
    return "should have timed out"


@task
def hold_still(payload: dict[str, Any], ctx: Context) -> str:
    time.sleep(float(payload.get("sleep", 3)))
    return "held"


@task
def returns_nan(payload: dict[str, Any]) -> float:
    return float("nan")


@task
def returns_nul(payload: dict[str, Any]) -> str:
    return "before\x00after"


@task
def returns_surrogate(payload: dict[str, Any]) -> str:
    return "half a pair: \udc80"


@task
def returns_deep(payload: dict[str, Any]) -> Any:
    value: Any = []
    for _ in range(int(payload.get("depth", 10_000))):
        value = [value]
    return value


@task
def raises_nul(payload: dict[str, Any]) -> None:
    raise RuntimeError("an error message with a NUL \x00 inside")


@task
def echo(payload: dict[str, Any]) -> int:
    return len(payload)


# One byte more than a jsonb string holds. PostgreSQL refuses it with an error of the class an
# outage's errors have (OperationalError).
JSONB_STRING_TOO_LONG = 2**28


@task
def returns_too_long(payload: dict[str, Any]) -> str:
    return "x" * JSONB_STRING_TOO_LONG


@task
def reports_too_long(payload: dict[str, Any], ctx: Context) -> str:
    ctx.progress(text="x" * JSONB_STRING_TOO_LONG)
    ctx.progress(50)
    return "reported"


too_long_stage = Pipeline("too_long_stage")


@too_long_stage.stage
def too_long(ctx: Context) -> str:
    return "x" * JSONB_STRING_TOO_LONG


@too_long_stage.stage
def after_too_long(ctx: Context) -> None:
    raise AssertionError("runs only after a stored output")


# The last stage's output is written with the cleanup's start.
too_long_last = Pipeline("too_long_last")


@too_long_last.stage
def small_first(ctx: Context) -> int:
    return 1


@too_long_last.stage
def too_long_at_last(ctx: Context) -> str:
    return "x" * JSONB_STRING_TOO_LONG


@too_long_last.cleanup
def cleans_up(ctx: Context) -> str:
    return "cleaned"


nan_stage = Pipeline("nan_stage")


@nan_stage.stage
def not_a_number(ctx: Context) -> float:
    return float("nan")
