"""Tasks and middleware for `test_middleware`, run in real worker processes.

Registered at import, as an application's task module would: an outer middleware with plain
hooks (which also sets the job's id in a context variable), an inner one with `async` hooks,
and one that raises in the hooks a job's payload names (`raise_in`). Every call is recorded in
the `effects` table, so a test reads the order they ran in.
"""

from __future__ import annotations

import contextvars
from typing import Any

from support.recording import task_connection

from worker import Context, Middleware, Outcome, Pipeline, Retry, add_middleware, task

current_job: contextvars.ContextVar[str] = contextvars.ContextVar("current_job", default="")


def record(job: str, kind: str) -> None:
    task_connection().execute("INSERT INTO effects (job, kind) VALUES (%s, %s)", (job, kind))


class Outer(Middleware):
    def before(self, ctx: Context) -> None:
        current_job.set(ctx.job_id)
        record(ctx.job_id, f"outer.before attempt {ctx.attempt}")

    def on_error(self, ctx: Context, exc: BaseException) -> None:
        record(ctx.job_id, f"outer.on_error {type(exc).__name__}: {exc}")

    def after(self, ctx: Context, outcome: Outcome) -> None:
        record(ctx.job_id, f"outer.after {outcome.kind}")


class Inner:
    """Not a `Middleware` subclass: any object with the hooks will do."""

    async def before(self, ctx: Context) -> None:
        record(ctx.job_id, "inner.before")

    async def on_error(self, ctx: Context, exc: BaseException) -> None:
        record(ctx.job_id, f"inner.on_error {type(exc).__name__}")

    async def after(self, ctx: Context, outcome: Outcome) -> None:
        record(ctx.job_id, f"inner.after {outcome.kind}")


class Faulty(Middleware):
    def _maybe_raise(self, ctx: Context, hook: str) -> None:
        if hook in ctx.payload.get("raise_in", []):
            raise RuntimeError(f"faulty {hook}")

    def before(self, ctx: Context) -> None:
        self._maybe_raise(ctx, "before")

    def on_error(self, ctx: Context, exc: BaseException) -> None:
        self._maybe_raise(ctx, "on_error")

    def after(self, ctx: Context, outcome: Outcome) -> None:
        self._maybe_raise(ctx, "after")


add_middleware(Outer())
add_middleware(Faulty())
add_middleware(Inner())


def _run(payload: dict[str, Any], ctx: Context, how: str) -> str:
    record(ctx.job_id, f"{how} task sees job {current_job.get() == ctx.job_id}")
    if ctx.attempt <= int(payload.get("failures", 0)):
        raise ValueError(f"attempt {ctx.attempt} fails")
    return "ok"


@task
def sync_job(payload: dict[str, Any], ctx: Context) -> str:
    return _run(payload, ctx, "sync")


@task
async def async_job(payload: dict[str, Any], ctx: Context) -> str:
    return _run(payload, ctx, "async")


@task
def retried_job(payload: dict[str, Any], ctx: Context) -> str:
    if ctx.attempt == 1:
        raise Retry(after=0)
    return "ok"


flow = Pipeline("mw_flow")


@flow.stage
def fetch(ctx: Context) -> int:
    record(ctx.job_id, f"fetch sees job {current_job.get() == ctx.job_id}")
    return 1


@flow.stage
async def store(ctx: Context) -> int:
    record(ctx.job_id, f"store sees job {current_job.get() == ctx.job_id}")
    if ctx.attempt <= int(ctx.payload.get("failures", 0)):
        raise KeyError("no such bucket")
    return 2
