"""Tasks the retry-policy, typed-task and queue-control tests run in real worker processes.

Each records what it did in the `effects` table (see `testtasks`), with the time, so a test can
tell how many ran at once and when each started.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel
from testtasks import record

from worker import Backoff, Pipeline, Retry, task


class Resize(BaseModel):
    path: str
    width: int


@task
def resize(payload: Resize) -> dict[str, Any]:
    """A typed task: it gets the validated model, never the raw dict."""
    assert isinstance(payload, Resize)
    return {"path": payload.path, "width": payload.width * 2}


@task(give_up_on=ValueError, max_retries=5)
def rejects(payload: dict[str, Any], ctx: Any) -> None:
    record(ctx.job_id, "ran")
    raise ValueError("this payload can never work")


@task(max_retries=1, backoff=Backoff.constant(0.05, jitter=False))
def fails_twice_at_most(payload: dict[str, Any], ctx: Any) -> None:
    record(ctx.job_id, "ran")
    raise RuntimeError("still broken")


@task
def retries_later(payload: dict[str, Any], ctx: Any) -> int:
    record(ctx.job_id, f"attempt {ctx.attempt}")
    if ctx.attempt == 1:
        raise Retry(after=float(payload["after"]))
    return int(ctx.attempt)


@task
def occupies(payload: dict[str, Any], ctx: Any) -> None:
    """Holds its slot for `seconds`, recording when it started and ended."""
    record(ctx.job_id, "start")
    time.sleep(float(payload.get("seconds", 0.3)))
    record(ctx.job_id, "end")


@task(concurrency=2, concurrency_key=lambda payload: f"customer:{payload['customer']}")
def per_customer(payload: dict[str, Any], ctx: Any) -> None:
    """At most two jobs of one customer at once, whichever workers run them."""
    occupies(payload, ctx)


gives_up = Pipeline("gives_up", max_retries=3, give_up_on=ValueError)


@gives_up.stage
def gives_up_check(ctx: Any) -> None:
    record(ctx.job_id, "stage")
    raise ValueError("this order can never ship")


@gives_up.cleanup
def gives_up_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "released"


# A pipeline with a retry limit of its own, which no job of it overrides unless enqueued so.
retried_twice = Pipeline(
    "retried_twice", max_retries=2, backoff=Backoff.constant(0.05, jitter=False)
)


@retried_twice.stage
def retried_twice_work(ctx: Any) -> None:
    record(ctx.job_id, "ran")
    raise RuntimeError("still broken")
