"""Cron expressions: the standard five fields, and the next (or latest) time they name.

`Cron.parse("*/5 9-17 * * mon-fri", tz="Europe/Paris")` reads minute, hour, day of month,
month and day of week, each `*`, a number, a list `a,b`, a range `a-b`, or a step `*/n` or
`a-b/n`; months may be named `jan`..`dec`, days `sun`..`sat`, and day of week 7 is Sunday
like 0. When both day fields are restricted (neither starts with `*`), a day matching either
one matches, as in Vixie cron.

Times are wall-clock times in the expression's time zone, DST included: a time the clock
skips (02:30 on the night clocks go forward) fires at the first valid moment after the gap
(03:00); a time the clock shows twice (02:30 on the night clocks go back) fires once, the
first time.

    >>> from datetime import datetime, UTC
    >>> nightly = Cron.parse("30 2 * * *", tz="Europe/Paris")
    >>> nightly.next_after(datetime(2026, 3, 28, 12, tzinfo=UTC))
    datetime.datetime(2026, 3, 29, 3, 0, tzinfo=zoneinfo.ZoneInfo(key='Europe/Paris'))

What this does not do: no seconds field, no `@daily` nicknames, no `L`, `W` or `#`.
"""

from __future__ import annotations

import bisect
import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MINUTE, HOUR, DAY = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
# Every search ends within this many steps (each a minute, an hour, a day or a month): the
# rarest day, 29 February, comes back within eight years, and a skipped or repeated hour adds
# at most a few dozen steps.
SEARCH_LIMIT = 20_000

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# The longest each month can be (February in a leap year): a day of month no listed month
# reaches would never fire.
_LONGEST = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    first_name: int = 0  # the number of names[0]


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTHS, 1),
    _Field("day-of-week", 0, 7, _DAYS, 0),
)


def _number(field: _Field, text: str) -> int:
    lowered = text.lower()
    if lowered in field.names:
        return field.names.index(lowered) + field.first_name
    if not text.isdigit():
        raise ValueError(f"{field.name}: {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise ValueError(f"{field.name}: {value} is out of range {field.low}-{field.high}")
    return value


def _values(field: _Field, text: str) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{field.name}: step {step_text!r} is not a positive number")
            step = int(step_text)
        if span == "*":
            low, high = field.low, field.high
        elif "-" in span:
            first, _, last = span.partition("-")
            low, high = _number(field, first), _number(field, last)
            if low > high:
                raise ValueError(f"{field.name}: range {span!r} goes backwards")
        elif step_text:
            raise ValueError(f"{field.name}: a step needs `*` or a range before it, not {span!r}")
        else:
            low = high = _number(field, span)
        values.update(range(low, high + 1, step))
    return values


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    if tz == "UTC":  # known without the zone database, which slim systems lack
        return UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {tz!r}") from None


def _first_at_or_after(values: tuple[int, ...], value: int) -> int | None:
    i = bisect.bisect_left(values, value)
    return values[i] if i < len(values) else None


def _last_at_or_before(values: tuple[int, ...], value: int) -> int | None:
    i = bisect.bisect_right(values, value)
    return values[i - 1] if i else None


def _day_edge(at: datetime, forward: bool) -> datetime:
    """The first minute of the next day, or the last of the previous one."""
    if forward:
        return datetime.combine(at.date() + DAY, time())
    return datetime.combine(at.date() - DAY, time(23, 59))


def _wall(at: datetime, tz: tzinfo) -> datetime:
    """The zone's wall-clock time at `at`, naive."""
    return at.astimezone(tz).replace(tzinfo=None)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression in a time zone; see the module's docs."""

    text: str
    tz: tzinfo
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, text: str, tz: str | tzinfo = "UTC") -> Cron:
        """Read a five-field expression; a `ValueError` names the bad field (or the zone)."""
        parts = text.split()
        if len(parts) != len(_FIELDS):
            raise ValueError(
                f"cron {text!r}: expected 5 fields (minute hour day-of-month month "
                f"day-of-week), got {len(parts)}"
            )
        try:
            sets = [_values(field, part) for field, part in zip(_FIELDS, parts, strict=True)]
        except ValueError as exc:
            raise ValueError(f"cron {text!r}: {exc}") from None
        minutes, hours, days, months, weekdays = sets
        weekdays = {d % 7 for d in weekdays}
        days_restricted, weekdays_restricted = (not p.startswith("*") for p in parts[2:5:2])
        never = not any(d <= _LONGEST[m - 1] for m in months for d in days)
        if days_restricted and not weekdays_restricted and never:
            raise ValueError(
                f"cron {text!r}: day-of-month: {parts[2]} never occurs in month {parts[3]}"
            )
        return cls(
            text=" ".join(parts),
            tz=_zone(tz),
            minutes=tuple(sorted(minutes)),
            hours=tuple(sorted(hours)),
            days=tuple(sorted(days)),
            months=tuple(sorted(months)),
            weekdays=tuple(sorted(weekdays)),
            days_restricted=days_restricted,
            weekdays_restricted=weekdays_restricted,
        )

    # -- the wall-clock calendar --------------------------------------------------------

    def _day_matches(self, day: date) -> bool:
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def _month_edge(self, at: datetime, forward: bool) -> datetime:
        """The first minute of the next listed month, or the last of the previous one."""
        year = at.year
        if forward:
            month = _first_at_or_after(self.months, at.month + 1)
            if month is None:
                year, month = year + 1, self.months[0]
            return datetime(year, month, 1)
        month = _last_at_or_before(self.months, at.month - 1)
        if month is None:
            year, month = year - 1, self.months[-1]
        return datetime(year, month, calendar.monthrange(year, month)[1], 23, 59)

    def _search(self, at: datetime, forward: bool) -> datetime:
        """The first matching wall-clock minute at or after `at` (or the last at or before
        it), jumping whole months, days and hours that cannot match."""
        pick = _first_at_or_after if forward else _last_at_or_before
        for _ in range(SEARCH_LIMIT):
            if at.month not in self.months:
                at = self._month_edge(at, forward)
                continue
            if not self._day_matches(at.date()):
                at = _day_edge(at, forward)
                continue
            hour = pick(self.hours, at.hour)
            if hour is None:
                at = _day_edge(at, forward)
                continue
            if hour != at.hour:
                at = at.replace(hour=hour, minute=0 if forward else 59)
            minute = pick(self.minutes, at.minute)
            if minute is None:
                at = at.replace(minute=0) + HOUR if forward else at.replace(minute=59) - HOUR
                continue
            return at.replace(minute=minute)
        raise RuntimeError(f"cron {self.text!r}: no time found near {at}")  # pragma: no cover

    # -- wall-clock times as moments ----------------------------------------------------

    def _moment(self, wall: datetime) -> datetime:
        """When the zone's clock shows `wall` (the first time, if twice; the end of the gap,
        if it skips it), in UTC."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        if _wall(first, self.tz) == wall:
            return first
        # A skipped time: the gap starts after `before` and ends by `after`; bisect to the
        # second the clock jumps, which is the first valid moment after `wall`.
        before = int(wall.replace(tzinfo=self.tz, fold=1).timestamp())
        after = int(first.timestamp())
        while after - before > 1:
            middle = (before + after) // 2
            if _wall(datetime.fromtimestamp(middle, UTC), self.tz) > wall:
                after = middle
            else:
                before = middle
        return datetime.fromtimestamp(after, UTC)

    def next_after(self, at: datetime) -> datetime:
        """The first moment after `at` (aware) the expression names, in its time zone."""
        at = at.astimezone(UTC)
        wall = _wall(at, self.tz).replace(second=0, microsecond=0) + MINUTE
        for _ in range(SEARCH_LIMIT):
            wall = self._search(wall, forward=True)
            moment = self._moment(wall)
            if moment > at:  # not so in the second pass of a repeated hour
                return moment.astimezone(self.tz)
            wall += MINUTE
        raise RuntimeError(f"cron {self.text!r}: no time found after {at}")  # pragma: no cover

    def latest_at_or_before(self, at: datetime) -> datetime:
        """The last moment at or before `at` (aware) the expression names, in its time zone."""
        at = at.astimezone(UTC)
        local = at.astimezone(self.tz)
        wall = local.replace(tzinfo=None, second=0, microsecond=0)
        if local.fold:
            # In the second pass of a repeated hour the rest of the first pass is behind us.
            overlap = local.replace(fold=0).utcoffset() or timedelta()
            wall += overlap - (local.utcoffset() or timedelta())
        for _ in range(SEARCH_LIMIT):
            wall = self._search(wall, forward=False)
            moment = self._moment(wall)
            if moment <= at:
                return moment.astimezone(self.tz)
            wall -= MINUTE
        raise RuntimeError(f"cron {self.text!r}: no time found before {at}")  # pragma: no cover
