"""A task's retry policy: how many retries, how long between them, and what is never retried.

`@task(max_retries=5, backoff=Backoff.exponential(base=2, max=600), give_up_on=(ValueError,))`
(or the same options of a `Pipeline`) sets them for one task; a task without them follows
`WORKER_MAX_RETRIES` and the worker's backoff (`WORKER_RETRY_BACKOFF_BASE`, `..._MAX`). A job
enqueued with its own `max_retries` keeps it. Code may also `raise Retry(after=30)` to ask for
another attempt at a time of its choosing; it counts as a retry like any failure.

`RetryRules.outcome` turns what an attempt raised into its `Outcome`: the one place that
decides between a retry (and its delay) and failing at once. Whether retries remain is decided
where the outcome is written (`sql.RECORD_OUTCOMES`), against the limit the claim read.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from worker.models import Outcome, OutcomeKind

# A longer wait is a bug; the timestamp would overflow.
MAX_RETRY_DELAY = 365 * 86400.0


def _seconds(value: float | timedelta, what: str) -> float:
    """`value` as seconds, or `ValueError` naming `what` if it is not from 0 to a year."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_RETRY_DELAY
    ):
        raise ValueError(f"{what} must be a number of seconds from 0 to a year, not {value!r}")
    return float(seconds)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before each retry: `base * factor**n + step * n`, at most `max`.

    >>> Backoff.exponential(base=2, max=600, jitter=False).delay(3)
    16.0
    >>> Backoff.linear(step=10, jitter=False).delay(2)
    30.0
    >>> Backoff.constant(5, jitter=False).delay(7)
    5.0

    With `jitter` (the default), each wait is drawn between half and all of that, so jobs
    that failed together do not all come back at the same instant.
    """

    base: float
    factor: float = 1.0
    step: float = 0.0
    max: float = MAX_RETRY_DELAY
    jitter: bool = True

    @classmethod
    def exponential(
        cls, base: float = 1.0, max: float = 600.0, jitter: bool = True, factor: float = 2.0
    ) -> Backoff:
        """`base` seconds before the first retry, `factor` times longer before each next."""
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 1:
            raise ValueError(f"backoff factor must be a number of at least 1, not {factor!r}")
        return cls(_seconds(base, "backoff base"), float(factor), 0.0, _seconds(max, "max"), jitter)

    @classmethod
    def linear(
        cls, step: float = 10.0, max: float = 600.0, jitter: bool = True, base: float | None = None
    ) -> Backoff:
        """`step` seconds more before each retry than before the one before (first: `base`,
        by default `step`)."""
        first = _seconds(step if base is None else base, "backoff base")
        return cls(first, 1.0, _seconds(step, "backoff step"), _seconds(max, "max"), jitter)

    @classmethod
    def constant(cls, seconds: float = 10.0, jitter: bool = True) -> Backoff:
        """The same wait before every retry."""
        wait = _seconds(seconds, "backoff")
        return cls(wait, 1.0, 0.0, wait, jitter)

    def delay(self, retries: int) -> float:
        """Seconds to wait before the retry that follows `retries` earlier ones."""
        try:
            wait = self.base * self.factor**retries + self.step * retries
        except OverflowError:
            wait = self.max
        wait = min(wait, self.max)
        return wait * (0.5 + random.random() / 2) if self.jitter else wait


class Retry(Exception):
    """Raise to end this attempt and retry the job `after` seconds from now (or a timedelta).

    It counts as a retry: once the job is out of retries, it fails with this error.

    >>> raise Retry(after=30)          # doctest: +SKIP
    """

    def __init__(self, after: float | timedelta = 0.0, reason: str = "") -> None:
        self.after = _seconds(after, "Retry(after=...)")
        super().__init__(reason or f"retry asked for in {self.after:g} s")


@dataclass(frozen=True)
class RetryRules:
    """One task's retry options, checked when the task is declared."""

    max_retries: int | None = None  # None: WORKER_MAX_RETRIES
    backoff: Backoff | None = None  # None: the worker's backoff
    give_up_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        limit = self.max_retries
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**31
        ):
            raise ValueError(f"max_retries must be an integer from 0 to {2**31 - 1}, not {limit!r}")
        if self.backoff is not None and not isinstance(self.backoff, Backoff):
            raise ValueError(
                "backoff must be a Backoff (Backoff.exponential, .linear or .constant)"
            )
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in self.give_up_on):
            raise ValueError("give_up_on must be a tuple of exception classes")

    def outcome(self, exc: BaseException, retries: int, error: str) -> Outcome:
        """The outcome of an attempt that raised `exc` after `retries` earlier retries."""
        if isinstance(exc, Retry):
            return Outcome(OutcomeKind.RETRY, error=error, delay=exc.after)
        # A `Retry` asks for another attempt; any other exception is an error (`exception`).
        if self.give_up_on and isinstance(exc, self.give_up_on):
            return Outcome(OutcomeKind.FAILED, error=error, exception=exc)
        delay = None if self.backoff is None else self.backoff.delay(retries)
        return Outcome(OutcomeKind.RETRY, error=error, delay=delay, exception=exc)


DEFAULT_RULES = RetryRules()


def rules(
    max_retries: int | None,
    backoff: Backoff | None,
    give_up_on: type[BaseException] | tuple[type[BaseException], ...],
) -> RetryRules:
    """The `RetryRules` of a task's options (one exception class or a tuple of them)."""
    if isinstance(give_up_on, type):
        give_up_on = (give_up_on,)
    if not isinstance(give_up_on, tuple):
        raise ValueError("give_up_on must be an exception class or a tuple of them")
    if max_retries is None and backoff is None and not give_up_on:
        return DEFAULT_RULES
    return RetryRules(max_retries, backoff, give_up_on)
