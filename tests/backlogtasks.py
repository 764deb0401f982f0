"""A pipeline shaped like the async job watcher, for the backlog test (tests/test_backlog.py).

Its first stage starts an "export" that is ready `ready_after` seconds later (the time is kept
in the stage's output instead of a background process, so a thousand of them cost the test
machine nothing), its polling stage records each poll in `effects` and snoozes `poll` seconds
until the export is ready, within the watcher's 30 s deadline, and an `ALL_DONE` cleanup
records that it ran.
"""

from __future__ import annotations

import time
from typing import Any

from testtasks import record

from worker import Pipeline

POLL_SECONDS = 1.0
DEADLINE_SECONDS = 30.0

polled = Pipeline("polled_export")


@polled.stage
def start_export(ctx: Any) -> dict[str, float]:
    return {"ready_at": time.time() + float(ctx.payload.get("ready_after", 1.0))}


@polled.stage(deadline=DEADLINE_SECONDS)
def await_export(ctx: Any) -> dict[str, bool]:
    record(ctx.job_id, "poll")
    if time.time() < ctx.outputs["start_export"]["ready_at"]:
        ctx.snooze(float(ctx.payload.get("poll", POLL_SECONDS)))
    return {"ready": True}


@polled.stage
def verify_export(ctx: Any) -> dict[str, bool]:
    return {"verified": ctx.outputs["await_export"]["ready"]}


@polled.cleanup
def remove_export(ctx: Any) -> None:
    record(ctx.job_id, "cleanup")
