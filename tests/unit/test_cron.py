"""Cron expressions: the five fields read as Vixie cron reads them, and the next and latest
times they name, DST included."""

from __future__ import annotations

import doctest
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from worker import cron
from worker.cron import Cron

PARIS = ZoneInfo("Europe/Paris")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def paris(*parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=PARIS, fold=fold)  # type: ignore[misc]


def ticks(expression: Cron, after: datetime, n: int) -> list[str]:
    """The next `n` times, as UTC ISO text (which, unlike aware datetimes in one zone,
    compares the moments themselves)."""
    found = []
    for _ in range(n):
        after = expression.next_after(after)
        found.append(after.astimezone(UTC).isoformat())
    return found


def test_the_module_examples_run() -> None:
    assert doctest.testmod(cron).failed == 0


@pytest.mark.parametrize(
    ("text", "after", "expected"),
    [
        ("* * * * *", utc(2026, 5, 1, 10, 0, 30), utc(2026, 5, 1, 10, 1)),
        ("* * * * *", utc(2026, 5, 1, 10, 0), utc(2026, 5, 1, 10, 1)),  # strictly after
        ("*/5 * * * *", utc(2026, 5, 1, 10, 3), utc(2026, 5, 1, 10, 5)),
        ("*/5 * * * *", utc(2026, 5, 1, 10, 57), utc(2026, 5, 1, 11, 0)),
        ("10-30/10 * * * *", utc(2026, 5, 1, 10, 31), utc(2026, 5, 1, 11, 10)),
        ("0,30 9 * * *", utc(2026, 5, 1, 9, 15), utc(2026, 5, 1, 9, 30)),
        ("0 9 * * *", utc(2026, 5, 1, 9, 0), utc(2026, 5, 2, 9, 0)),
        ("0 0 1 * *", utc(2026, 12, 15), utc(2027, 1, 1)),  # year rollover
        ("0 0 31 * *", utc(2026, 4, 1), utc(2026, 5, 31)),  # April has no 31st
        ("0 0 29 2 *", utc(2026, 3, 1), utc(2028, 2, 29)),  # the next leap year
        ("0 0 29 2 *", utc(2097, 3, 1), utc(2104, 2, 29)),  # 2100 is not one
        ("0 12 * jan,jul *", utc(2026, 2, 1), utc(2026, 7, 1, 12)),
        ("0 12 * * mon-fri", utc(2026, 5, 2, 13), utc(2026, 5, 4, 12)),  # Saturday to Monday
        ("0 12 * * 7", utc(2026, 5, 4), utc(2026, 5, 10, 12)),  # 7 is Sunday
        ("0 12 * * 0", utc(2026, 5, 4), utc(2026, 5, 10, 12)),
        ("0 12 * * SUN", utc(2026, 5, 4), utc(2026, 5, 10, 12)),
        ("0 12 * * 5-7", utc(2026, 5, 4), utc(2026, 5, 8, 12)),
        ("59 23 31 12 *", utc(2026, 1, 1), utc(2026, 12, 31, 23, 59)),
        ("0 */6 * * *", utc(2026, 5, 1, 7), utc(2026, 5, 1, 12)),
    ],
)
def test_next_after(text: str, after: datetime, expected: datetime) -> None:
    assert Cron.parse(text).next_after(after) == expected


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # The 13th or any Friday: May 2026 has Fridays on the 1st, 8th, 15th; the 13th is a Wednesday.
    either = Cron.parse("0 0 13 * fri")
    assert ticks(either, utc(2026, 5, 1, 1), 3) == [
        "2026-05-08T00:00:00+00:00",
        "2026-05-13T00:00:00+00:00",
        "2026-05-15T00:00:00+00:00",
    ]


def test_a_day_field_starting_with_a_star_leaves_the_other_one_in_charge() -> None:
    fridays = Cron.parse("0 0 * * fri")
    assert fridays.next_after(utc(2026, 5, 9)) == utc(2026, 5, 15)
    odd_fridays = Cron.parse("0 0 */2 * fri")  # as in Vixie cron: both must match
    assert odd_fridays.next_after(utc(2026, 5, 2)) == utc(2026, 5, 15)


@pytest.mark.parametrize(
    ("text", "at", "expected"),
    [
        ("*/5 * * * *", utc(2026, 5, 1, 10, 3), utc(2026, 5, 1, 10, 0)),
        ("*/5 * * * *", utc(2026, 5, 1, 10, 5), utc(2026, 5, 1, 10, 5)),  # at counts
        ("0 9 * * *", utc(2026, 5, 1, 8), utc(2026, 4, 30, 9)),
        ("0 0 1 1 *", utc(2026, 6, 1), utc(2026, 1, 1)),
        ("0 0 29 2 *", utc(2027, 6, 1), utc(2024, 2, 29)),
        ("30 12 * * mon", utc(2026, 5, 10), utc(2026, 5, 4, 12, 30)),
    ],
)
def test_latest_at_or_before(text: str, at: datetime, expected: datetime) -> None:
    assert Cron.parse(text).latest_at_or_before(at) == expected


def test_a_time_in_the_gap_when_clocks_go_forward_fires_when_the_gap_ends() -> None:
    # Europe/Paris, 29 March 2026: 02:00 CET jumps to 03:00 CEST; 02:30 never happens.
    nightly = Cron.parse("30 2 * * *", tz="Europe/Paris")
    assert ticks(nightly, paris(2026, 3, 28, 12), 3) == [
        "2026-03-29T01:00:00+00:00",  # 03:00 CEST, the first valid moment after 02:30
        "2026-03-30T00:30:00+00:00",  # 02:30 CEST
        "2026-03-31T00:30:00+00:00",
    ]
    assert nightly.latest_at_or_before(paris(2026, 3, 29, 3, 10)) == paris(2026, 3, 29, 3)


def test_every_quarter_hour_across_the_gap_fires_once_at_its_end() -> None:
    quarterly = Cron.parse("*/15 * * * *", tz="Europe/Paris")
    assert ticks(quarterly, paris(2026, 3, 29, 1, 40), 3) == [
        "2026-03-29T00:45:00+00:00",  # 01:45 CET
        "2026-03-29T01:00:00+00:00",  # 03:00 CEST: 02:00 to 02:45 skipped, fired once
        "2026-03-29T01:15:00+00:00",  # 03:15 CEST
    ]


def test_a_time_shown_twice_when_clocks_go_back_fires_once() -> None:
    # Europe/Paris, 25 October 2026: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    nightly = Cron.parse("30 2 * * *", tz="Europe/Paris")
    assert ticks(nightly, paris(2026, 10, 24, 12), 2) == [
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST, the first time
        "2026-10-26T01:30:00+00:00",  # 02:30 CET, the next day
    ]
    second_pass = paris(2026, 10, 25, 2, 40, fold=1)
    assert nightly.next_after(second_pass).astimezone(UTC) == utc(2026, 10, 26, 1, 30)
    assert nightly.latest_at_or_before(second_pass).astimezone(UTC) == utc(2026, 10, 25, 0, 30)


def test_in_the_repeated_hour_each_wall_clock_time_fires_once() -> None:
    quarterly = Cron.parse("*/15 * * * *", tz="Europe/Paris")
    assert ticks(quarterly, paris(2026, 10, 25, 2, 40), 3) == [
        "2026-10-25T00:45:00+00:00",  # 02:45 CEST
        "2026-10-25T02:00:00+00:00",  # 03:00 CET: 02:00 to 02:45 CET were shown already
        "2026-10-25T02:15:00+00:00",
    ]
    # From inside the second pass, the latest tick is the first pass's 02:45.
    latest = quarterly.latest_at_or_before(paris(2026, 10, 25, 2, 20, fold=1))
    assert latest.astimezone(UTC) == utc(2026, 10, 25, 0, 45)


def test_times_come_back_in_the_expressions_zone() -> None:
    at = Cron.parse("0 9 * * *", tz="Europe/Paris").next_after(utc(2026, 7, 1))
    assert at.tzinfo == PARIS and at.hour == 9 and at.utcoffset() == timedelta(hours=2)


def test_a_rare_time_is_found_by_jumping_not_by_walking_minutes() -> None:
    leap = Cron.parse("0 0 29 2 mon")  # either Feb 29 or a Monday in February
    yearly = Cron.parse("59 23 31 12 *")
    started = time.perf_counter()
    for _ in range(20):
        yearly.next_after(utc(2026, 1, 1))
        yearly.latest_at_or_before(utc(2026, 12, 31))
        Cron.parse("0 0 29 2 *").next_after(utc(2097, 3, 1))
        leap.next_after(utc(2026, 3, 1))
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week: 8 is out of range 0-7"),
        ("* * * foo *", "month: 'foo' is not a number"),
        ("*/0 * * * *", "minute: step '0' is not a positive number"),
        ("*/x * * * *", "minute: step 'x' is not a positive number"),
        ("5/10 * * * *", "minute: a step needs `*` or a range"),
        ("30-10 * * * *", "minute: range '30-10' goes backwards"),
        ("* * * * fri-mon", "day-of-week: range 'fri-mon' goes backwards"),
        ("1,,2 * * * *", "minute: '' is not a number"),
        ("* * 30 feb *", "day-of-month: 30 never occurs in month feb"),
        ("* * 31 4,6 *", "day-of-month: 31 never occurs"),
        ("-1 * * * *", "minute: '' is not a number"),
    ],
)
def test_a_bad_expression_names_its_bad_field_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="cron") as caught:
        Cron.parse(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_restricted_day_of_week_makes_an_impossible_day_of_month_possible() -> None:
    either = Cron.parse("0 0 30 2 mon")
    assert either.next_after(utc(2026, 1, 31)) == utc(2026, 2, 2)


def test_names_are_case_insensitive_and_fields_may_be_spaced_freely() -> None:
    assert Cron.parse("0  12 * JAN-mar  Mon").text == "0 12 * JAN-mar Mon"
    assert Cron.parse("0 12 * JAN-mar Mon").months == (1, 2, 3)


def test_an_unknown_zone_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        Cron.parse("* * * * *", tz="Mars/Olympus")
