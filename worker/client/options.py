"""The options of one enqueue, as types: what `Task.enqueue` passes on to `Client.enqueue`.

Checked by mypy only; the values are checked where every enqueue is (`validation`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypedDict

from worker.db.targets import AsyncTarget, SyncTarget


class _Options(TypedDict, total=False):
    queue: str
    priority: int
    delay: float | timedelta
    run_at: datetime | None
    max_retries: int | None
    unique_key: str | None
    concurrency_key: str | None


class EnqueueOptions(_Options, total=False):
    """`Client.enqueue`'s keyword options."""

    connection: SyncTarget


class AsyncEnqueueOptions(_Options, total=False):
    """`AsyncClient.enqueue`'s keyword options."""

    connection: AsyncTarget
