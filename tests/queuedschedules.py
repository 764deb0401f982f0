"""A periodic task whose jobs go to a queue of its own, for the schedule tests."""

from __future__ import annotations

from typing import Any

from worker import task


@task(every=1, queue="reports")
def report(payload: dict[str, Any]) -> None:
    return None
