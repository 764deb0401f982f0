"""The HTTP edge's request parsing: parameters, cursors, job ids, origins and JSON bodies."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from worker.api.params import (
    CURSOR_PATTERN,
    MAX_EVENT_ID,
    ApiError,
    decode_cursor,
    encode_cursor,
    int_param,
    is_json,
    parse_json,
    path_job_id,
    same_host,
    text_param,
)

JOB = "0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b"
AT = datetime(2026, 11, 30, 8, 1, 2, 345678, tzinfo=UTC)


def _request(job_id: str) -> Request:
    return Request({"type": "http", "method": "GET", "path_params": {"id": job_id}})


def test_a_cursor_carries_the_keyset_of_the_last_job_unchanged() -> None:
    cursor = encode_cursor(AT, JOB)
    assert "=" not in cursor and "|" not in cursor
    assert decode_cursor(cursor) == (AT, JOB)


@given(st.from_regex(CURSOR_PATTERN, fullmatch=True))
def test_every_cursor_of_the_form_the_spec_declares_is_a_place_in_the_list(cursor: str) -> None:
    at, last_id = decode_cursor(cursor)
    micros, hex_id = cursor.split("-")
    assert encode_cursor(at, last_id) == f"{int(micros)}-{hex_id}"


@pytest.mark.parametrize(
    "cursor", ["", "nope", "!!!", encode_cursor(AT, "42"), "MjAyNi0xMS0zMA", "1-" + "0" * 31]
)
def test_a_cursor_that_no_page_gave_is_a_422(cursor: str) -> None:
    with pytest.raises(ApiError) as refused:
        decode_cursor(cursor)
    assert refused.value.status == 422
    assert "invalid cursor" in refused.value.message


def test_an_integer_parameter_is_bounded_and_none_only_when_absent() -> None:
    assert int_param(None, "limit", 1, 500) is None
    assert int_param("50", "limit", 1, 500) == 50
    assert int_param(str(MAX_EVENT_ID), "after", 0, MAX_EVENT_ID) == MAX_EVENT_ID


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "must be from 1 to 500, not 0"),
        ("501", "not 501"),
        ("ten", "is not an integer"),
        ("", "is not an integer"),  # an empty value is no integer, as the spec says
        ("1_0", "is not an integer"),
    ],
)
def test_an_integer_out_of_bounds_or_not_one_is_a_422_naming_it(value: str, words: str) -> None:
    with pytest.raises(ApiError) as refused:
        int_param(value, "limit", 1, 500)
    assert refused.value.status == 422
    assert refused.value.message.startswith("invalid limit: ") and words in refused.value.message


def test_a_text_parameter_refuses_nul_which_no_job_can_hold() -> None:
    assert text_param("", "queue") is None
    assert text_param("mail", "queue") == "mail"
    with pytest.raises(ApiError, match="NUL"):
        text_param("ma\x00il", "queue")


def test_a_path_job_id_is_canonical_and_anything_else_is_an_unknown_job() -> None:
    assert path_job_id(_request(JOB.upper())) == JOB
    with pytest.raises(ApiError) as refused:
        path_job_id(_request("42"))
    assert (refused.value.status, refused.value.message) == (404, "no job 42")


def test_json_is_recognised_whatever_its_parameters() -> None:
    assert is_json("application/json")
    assert is_json("Application/JSON; charset=utf-8")
    assert not is_json("text/plain")
    assert not is_json("application/jsonx")


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost", "localhost:80", True),
        ("https://localhost", "localhost", True),
        ("http://evil.example", "127.0.0.1:8000", False),
        ("http://127.0.0.1:9000", "127.0.0.1:8000", False),
        ("file://", "127.0.0.1", False),
        ("http://127.0.0.1:port", "127.0.0.1", False),
        ("null", "127.0.0.1", False),
    ],
)
def test_an_origin_matches_only_the_host_and_port_it_was_sent_to(
    origin: str, host: str, same: bool
) -> None:
    assert same_host(origin, host) is same


def test_a_body_is_json_that_jsonb_can_store() -> None:
    assert parse_json(b'{"task": "add", "payload": {"a": 1.5}}') == {
        "task": "add",
        "payload": {"a": 1.5},
    }


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"{nope", "not valid JSON"),
        (b'{"a": NaN}', "NaN is not JSON"),
        (b'{"a": 1e400}', "too large for a float"),
        (b"[" * 100_000, "nested too deeply"),
        (b"\xff", "not valid JSON"),
    ],
)
def test_a_body_jsonb_could_not_store_is_a_422_saying_why(raw: bytes, words: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_json(raw)
    assert refused.value.status == 422 and words in refused.value.message


def test_half_a_surrogate_pair_is_refused_naming_its_field() -> None:
    with pytest.raises(ApiError, match="payload: contains half of a UTF-16 surrogate pair"):
        parse_json(b'{"payload": "\\ud800"}')
