"""Periodic tasks the schedule tests run in real worker processes.

`TICK_EVERY` (seconds, 1 by default) sets `tick`'s interval, so that a test can change the
schedule between two runs of the workers, as a deploy would.
"""

from __future__ import annotations

import os
from typing import Any

from worker import task


@task(every=float(os.environ.get("TICK_EVERY", "1")))
def tick(payload: dict[str, Any]) -> None:
    return None


@task(cron="0 0 1 1 *")
def new_year(payload: dict[str, Any]) -> None:
    return None


@task(cron="30 2 * * mon-fri", tz="Europe/Paris", queue="reports")
def nightly(payload: dict[str, Any]) -> None:
    return None
