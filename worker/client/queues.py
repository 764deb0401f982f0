"""A queue's controls as the client sees them: its state, and the checks on its limits.

`QueueState` is a row of `sql.QUEUE_STATES`; `limit_params` checks a queue's new limits
before anything is written, naming the bad option. The client's `pause_queue`,
`resume_queue`, `limit_queue` and `queues` use both. What a pause or a limit does to claims
is `worker.queue_budget`'s (migration 0008). Nothing here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from worker.client.errors import InvalidJob
from worker.client.validation import text_problem


@dataclass(frozen=True)
class QueueState:
    """One queue: whether it is paused, its limits (None: none), and its live jobs.

    >>> QueueState("emails", paused=False, concurrency=2, rate=None, burst=None,
    ...            pending=10, processing=2).limited
    True
    """

    name: str
    paused: bool
    concurrency: int | None  # jobs of the queue running at once, across all workers
    rate: float | None  # jobs started per second, at most
    burst: float | None  # jobs the rate lets start at once after a quiet spell
    pending: int
    processing: int

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    @classmethod
    def of(cls, row: Any) -> QueueState:
        """The state from a row of `sql.QUEUE_STATES`."""
        return cls(
            name=row.name,
            paused=row.paused,
            concurrency=row.concurrency,
            rate=row.rate,
            burst=row.burst,
            pending=int(row.pending),
            processing=int(row.processing),
        )


def queue_name(name: object) -> str:
    """`name` if it is a queue's name, else `InvalidJob` saying why."""
    if not isinstance(name, str) or not 1 <= len(name) <= 255 or text_problem(name):
        raise InvalidJob("queue name must be a string of 1 to 255 characters, with no NUL")
    return name


def _positive(value: object, what: str, least: float) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < least
    ):
        raise InvalidJob(f"{what} must be a number of at least {least:g}, not {value!r}")
    return float(value)


def limit_params(
    name: str, concurrency: int | None, rate: float | None, burst: float | None
) -> dict[str, Any]:
    """The parameters of `sql.LIMIT_QUEUE`; `InvalidJob` naming a bad option."""
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidJob(f"concurrency must be an integer of at least 1, not {concurrency!r}")
    if burst is not None and rate is None:
        raise InvalidJob("burst needs a rate: it is how many jobs the rate lets start at once")
    return {
        "name": queue_name(name),
        "concurrency": concurrency,
        "rate": _positive(rate, "rate", 1e-6),
        "burst": _positive(burst, "burst", 1),
    }
