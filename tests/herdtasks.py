"""Tasks of the session and wake-up tests: they open no connection of their own, so every
session under a worker process's application name is the worker's."""

from __future__ import annotations

import time
from typing import Any

from worker import Context, task


@task
def busy(payload: dict[str, Any], ctx: Context) -> str:
    """Publishes progress while it runs `sleep` seconds."""
    steps = int(payload.get("steps", 5))
    for i in range(steps):
        ctx.progress(i, of=steps)
        time.sleep(float(payload.get("sleep", 2)) / steps)
    return "done"


@task
def noop(payload: dict[str, Any]) -> None:
    return None
