"""The CLI's pure parts: ages, job ids, JSON options and the way results are worded."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import typer

from worker.cli.errors import UsageError
from worker.cli.options import parse_age, parse_job_id, parse_json
from worker.cli.output import ago, span, styled, summary


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("15m", 900.0),
        ("12h", 43_200.0),
        ("7d", 604_800.0),
        ("2w", 1_209_600.0),
        ("90", 90.0),
        (" 1.5H ", 5400.0),
        ("0", 0.0),
    ],
)
def test_an_age_reads_in_every_unit_and_as_plain_seconds(text: str, seconds: float) -> None:
    assert parse_age(text, "--older-than") == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "nan", "inf", "1e400d", "7x", "d"])
def test_an_age_that_is_not_one_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(typer.BadParameter) as refused:
        parse_age(text, "--newer-than")
    assert refused.value.param_hint == "--newer-than"
    assert "not an age like 30s, 15m, 12h, 7d or 2w" in refused.value.format_message()


def test_a_job_id_is_read_in_any_uuid_spelling_and_printed_canonically() -> None:
    canonical = "0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b"
    assert parse_job_id(canonical.upper()) == canonical
    assert parse_job_id(canonical.replace("-", "")) == canonical
    assert parse_job_id(None) is None


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("0b0e3c5e", "0b0e3c5e"),
        ("0B0E3C5E-2f4a-4c1e-9d3b", "0b0e3c5e2f4a4c1e9d3b"),
        ("…2e3d4c5b", "…2e3d4c5b"),
        ("...6a1f-2e3d4c5b", "…6a1f2e3d4c5b"),
        ("4c5b", "4c5b"),
    ],
)
def test_the_start_or_the_end_of_a_job_id_is_read_for_a_lookup(text: str, read: str) -> None:
    assert parse_job_id(text) == read


@pytest.mark.parametrize(
    "text", ["nope", "42", "", "…abc", "0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b0"]
)
def test_a_job_id_that_is_not_a_uuid_nor_a_part_of_one_is_a_usage_error(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not a job id"):
        parse_job_id(text)


def test_json_options_parse_and_bad_json_says_where_it_breaks() -> None:
    assert parse_json('{"to": "ada"}', "--payload") == {"to": "ada"}
    with pytest.raises(UsageError, match=r"--payload is not valid JSON: .* at position 1"):
        parse_json("{nope", "--payload")


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (None, "-"),
        (0.85, "850ms"),
        (4.24, "4.2s"),
        (42.0, "42s"),
        (185.0, "3m 05s"),
        (7_800.0, "2h 10m"),
        (47 * 3600.0, "47h 00m"),
        (3 * 86_400 + 4 * 3600.0, "3d 4h"),
    ],
)
def test_a_duration_is_worded_short_in_its_largest_units(seconds: float | None, words: str) -> None:
    assert span(seconds) == words


def test_an_age_is_worded_as_a_duration_before_now() -> None:
    assert ago(None) == "-"
    assert ago(datetime.now(UTC) - timedelta(minutes=3, seconds=5)).endswith("ago")
    assert ago(datetime.now(UTC) - timedelta(minutes=3, seconds=5)).startswith("3m 0")


def test_each_status_has_its_colour_and_an_unknown_one_prints_plain() -> None:
    assert styled("failed") == "[red]failed[/]"
    assert styled("completed") == "[green]completed[/]"
    assert styled("mystery") == "[default]mystery[/]"


def test_an_error_summary_is_its_first_line_shortened_to_the_width() -> None:
    error = "ValueError: row 17: price is not a number\nTraceback (most recent call last): ..."
    assert summary(error) == "ValueError: row 17: price is not a number"
    assert summary(error, 12) == "ValueError:…"
    assert len(summary("x" * 500, 60)) == 60
    assert summary(None) == ""


def test_no_age_is_infinite_or_negative() -> None:
    for text in ("1w", "1000000d"):
        assert 0 <= parse_age(text, "--older-than") < math.inf
