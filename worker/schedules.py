"""Periodic tasks: when a task's jobs are due, and the registry of those schedules.

`@task(cron="0 9 * * mon-fri", tz="Europe/Paris")` or `@task(every=30)` gives the task a
`Schedule`, registered in `SCHEDULES`; every worker importing the task then enqueues its jobs,
in the schedule's queue (`queue=`, else `default`), at each tick (see
`worker.daemon.plugins.scheduler`), and the database sees that each tick is enqueued once
however many workers do so (`worker.db.sql.schedules`).

Ticks are moments every worker computes alike: a cron expression's times in its zone, or the
multiples of `every` seconds since the Unix epoch (every=30 ticks at :00 and :30 of each
minute). A schedule's `key`, its identity in `worker.schedules`, is the task's name and its
spec: change the schedule and it is a new one. The queue is not part of it: moving a schedule's
jobs to another queue keeps its ticks, so no tick fires twice across that deploy.

What this does not do: it enqueues nothing itself, and it does not remember what fired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from worker.client.validation import text_problem
from worker.cron import Cron

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
MAX_EVERY = timedelta(days=36525)  # a century: a longer interval is a bug, and dates overflow


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a task's jobs are due: a cron expression in a zone, or every so many seconds."""

    task: str
    cron: Cron | None = None
    every: int | None = None  # microseconds, so that every worker computes the same ticks
    queue: str = "default"  # where its jobs are enqueued

    @property
    def spec(self) -> str:
        """The schedule as text: `cron 0 9 * * * Europe/Paris` or `every 30s`."""
        if self.cron is not None:
            return f"cron {self.cron.text} {self.timezone}"
        return f"every {self.seconds}s"

    @property
    def key(self) -> str:
        """The schedule's identity in `worker.schedules`: the task and its spec."""
        return f"{self.task} {self.spec}"

    @property
    def timezone(self) -> str:
        """The cron's zone by name; "-" for an interval, which has none."""
        if self.cron is None:
            return "-"
        return str(getattr(self.cron.tz, "key", self.cron.tz))

    @property
    def seconds(self) -> str:
        """The interval in seconds as text (30, 0.5), for a spec or a listing."""
        assert self.every is not None
        whole, micros = divmod(self.every, 1_000_000)
        return str(whole) if not micros else repr(self.every / 1_000_000)

    @property
    def description(self) -> str:
        """What `worker schedule` shows: the cron text, or `every 30s`."""
        return self.cron.text if self.cron is not None else f"every {self.seconds}s"

    def next_after(self, at: datetime) -> datetime:
        """The first tick after `at` (aware)."""
        if self.cron is not None:
            return self.cron.next_after(at)
        assert self.every is not None
        return _EPOCH + _MICRO * ((_micros(at) // self.every + 1) * self.every)

    def latest_at_or_before(self, at: datetime) -> datetime:
        """The last tick at or before `at` (aware)."""
        if self.cron is not None:
            return self.cron.latest_at_or_before(at)
        assert self.every is not None
        return _EPOCH + _MICRO * (_micros(at) // self.every * self.every)


def _micros(at: datetime) -> int:
    if at.tzinfo is None:
        raise ValueError(f"{at!r} has no time zone")
    return (at - _EPOCH) // _MICRO


def schedule_for(
    task: str,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    tz: str | None = None,
    queue: str | None = None,
) -> Schedule | None:
    """The task's schedule from `@task`'s options, or None; a `ValueError` names a bad one.

    >>> schedule_for("report", cron="0 9 * * *", tz="Europe/Paris").key
    'report cron 0 9 * * * Europe/Paris'
    >>> schedule_for("ping", every=timedelta(minutes=5)).key
    'ping every 300s'
    >>> schedule_for("report", cron="0 9 * * *", queue="reports").queue
    'reports'
    """
    if cron is not None and every is not None:
        raise ValueError("cron, every: give one schedule, not both")
    if tz is not None and cron is None:
        raise ValueError("tz: applies to a cron schedule only")
    if queue is not None and cron is None and every is None:
        raise ValueError("queue: applies to a periodic task only (with cron= or every=)")
    if queue is not None and (
        not isinstance(queue, str) or not 1 <= len(queue) <= 255 or text_problem(queue)
    ):
        raise ValueError(f"queue: expected a name of 1 to 255 characters, not {queue!r}")
    where = "default" if queue is None else queue
    if cron is not None:
        if not isinstance(cron, str):
            raise ValueError(f"cron: expected the expression as text, not {cron!r}")
        try:
            return Schedule(task, cron=Cron.parse(cron, "UTC" if tz is None else tz), queue=where)
        except ValueError as exc:
            option = "tz" if str(exc).startswith("unknown time zone") else "cron"
            raise ValueError(f"{option}: {exc}") from None
    if every is None:
        return None
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"every: expected seconds or a timedelta, not {every!r}")
    micros = round(seconds * 1_000_000) if math.isfinite(seconds) else 0
    if not 0 < micros <= MAX_EVERY // _MICRO:
        raise ValueError(
            f"every: must be a positive number of seconds, at most a century, not {every!r}"
        )
    return Schedule(task, every=micros, queue=where)


SCHEDULES: dict[str, Schedule] = {}  # by task name: a task has one schedule at most


def register_schedule(schedule: Schedule) -> None:
    """Add a task's schedule to `SCHEDULES`, which the workers read at start."""
    SCHEDULES[schedule.task] = schedule
