"""Every refusal of a bad job, before anything is written, with a message naming the problem;
and the exact text a good batch is sent as. No database."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

import pytest

from worker.client import InvalidJob, JobNotFound, JobSpec
from worker.client.validation import (
    COPY_CHUNK,
    MAX_DELAY,
    MAX_RETRIES_LIMIT,
    job_id_of,
    parse_duration,
    prepared_many,
    prune_params,
    run_at_problem,
    stored_json,
    text_problem,
    validated,
)
from worker.client.waiting import deadline_of
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE

LIMIT = 1_000_000


def refusal(**fields: object) -> str:
    spec = JobSpec(**{"task": "add", **fields})  # type: ignore[arg-type]
    with pytest.raises(InvalidJob) as raised:
        validated(spec, LIMIT)
    return str(raised.value)


@pytest.mark.parametrize("task", ["", "x" * (MAX_TASK_NAME + 1), "a\x00b", "\ud800", 7, None])
def test_a_task_name_that_is_empty_too_long_not_text_or_unstorable_is_refused(task):
    assert refusal(task=task) == (
        f"task name must be a string of 1 to {MAX_TASK_NAME} characters, with no NUL"
    )


@pytest.mark.parametrize("queue", ["", "q" * 256, "q\x00", "\udfff", 3])
def test_a_queue_name_that_is_empty_too_long_not_text_or_unstorable_is_refused(queue):
    assert refusal(queue=queue) == (
        "queue name must be a string of 1 to 255 characters, with no NUL"
    )


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, None])
def test_a_payload_that_is_not_a_json_object_is_refused_naming_its_type(payload):
    assert refusal(payload=payload) == (
        f"payload must be a JSON object (a dict), not {type(payload).__name__}"
    )


def test_a_payload_that_json_cannot_hold_is_refused_as_a_payload():
    assert refusal(payload={"x": math.nan}).startswith("payload ")
    assert refusal(payload={"x": object()}).startswith("payload ")
    assert refusal(payload={"x": "a\x00b"}).startswith("payload ")


def test_a_payload_over_the_limit_is_refused_naming_its_size_and_the_setting():
    with pytest.raises(InvalidJob) as raised:
        validated(JobSpec("add", {"x": "é" * 10}), 20)
    assert str(raised.value) == (
        "payload is 28 bytes; the limit is 20 (WORKER_MAX_PAYLOAD_BYTES): "
        "store large data elsewhere and pass a reference"
    )


@pytest.mark.parametrize("priority", [PRIORITY_RANGE[0] - 1, PRIORITY_RANGE[1] + 1, 1.5, True])
def test_a_priority_out_of_range_or_not_an_integer_is_refused(priority):
    low, high = PRIORITY_RANGE
    assert refusal(priority=priority) == f"priority must be an integer from {low} to {high}"


@pytest.mark.parametrize("retries", [-1, MAX_RETRIES_LIMIT + 1, 2.0, False, "3"])
def test_max_retries_out_of_range_or_not_an_integer_is_refused(retries):
    assert refusal(max_retries=retries) == (
        f"max_retries must be an integer from 0 to {MAX_RETRIES_LIMIT}"
    )


@pytest.mark.parametrize(
    "delay", [-1, math.inf, math.nan, "5", True, MAX_DELAY + timedelta(days=1), timedelta(-1)]
)
def test_a_delay_negative_unbounded_or_not_a_duration_is_refused(delay):
    assert refusal(delay=delay) == (
        "delay must be a number of seconds or a timedelta, from 0 to 100 years"
    )


@pytest.mark.parametrize("run_at", [datetime(2030, 1, 1), "2030-01-01T00:00:00Z", 0])
def test_a_run_at_without_a_time_zone_or_not_a_datetime_is_refused(run_at):
    assert refusal(run_at=run_at) == (
        "run_at must be a timezone-aware datetime (e.g. datetime.now(UTC))"
    )


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_a_run_at_that_could_not_be_read_back_is_refused_naming_the_years(run_at):
    assert refusal(run_at=run_at) == "run_at must fall between the years 2 and 9998"
    assert run_at_problem(run_at) == "must fall between the years 2 and 9998"


def test_a_good_job_becomes_the_parameters_of_its_insert():
    due = datetime(2030, 1, 1, tzinfo=UTC)
    spec = JobSpec("add", {"a": 1}, "q", 5, timedelta(seconds=3), due, 2, "add:1")
    assert validated(spec, LIMIT) == {
        "task": "add",
        "payload": '{"a":1}',
        "queue": "q",
        "priority": 5,
        "run_at": due,
        "delay": 3.0,
        "max_retries": 2,
        "unique_key": "add:1",
        "concurrency_key": None,
    }


def test_text_problems_name_nul_and_half_surrogates():
    assert text_problem("fine") is None
    assert text_problem("a\x00") == "must not contain a NUL character (\\u0000)"
    assert text_problem("\ud800") == "must not contain half of a UTF-16 surrogate pair"


def test_a_bad_job_in_a_batch_is_named_by_its_index():
    jobs = [JobSpec("add"), ("add", {"a": 1}), JobSpec("add", priority=10**6)]
    with pytest.raises(InvalidJob, match=r"^job 2: priority must be an integer"):
        prepared_many(jobs, LIMIT)
    with pytest.raises(InvalidJob, match=r"^job 1: expected a JobSpec or a \(task, payload\)"):
        prepared_many([JobSpec("add"), ["add", {}]], LIMIT)  # type: ignore[list-item]


def test_a_batch_is_sent_as_json_rows_that_read_back_as_its_jobs():
    due = datetime(2030, 1, 1, tzinfo=UTC)
    batch = prepared_many(
        [JobSpec('t"1', {"k": "v\n"}, "q\t", 3, 1.5, None, 4, 'k"1'), JobSpec("t", run_at=due)],
        LIMIT,
    )
    rows = json.loads(batch.params()["jobs"])
    assert [r["i"] for r in rows] == batch.ids
    assert all(UUID(i).version == 7 for i in batch.ids)
    assert rows[0] == {
        "i": batch.ids[0], "t": 't"1', "p": {"k": "v\n"}, "q": "q\t",
        "pr": 3, "ra": None, "d": 1.5, "mr": 4, "u": 'k"1', "ck": None,
    }  # fmt: skip
    assert rows[1]["ra"] == due.isoformat() and rows[1]["mr"] is None
    assert not batch.copyable  # a waiting job needs the server's clock: no COPY


def test_jobs_of_a_batch_sharing_a_unique_key_are_sent_once_and_never_by_copy():
    batch = prepared_many([JobSpec("t", unique_key="k"), JobSpec("t"), ("t", {})], LIMIT)
    assert not batch.copyable  # COPY cannot skip a row whose key is held
    batch = prepared_many(
        [JobSpec("t", unique_key="a"), JobSpec("t", unique_key="b"), JobSpec("t", unique_key="a")],
        LIMIT,
    )
    assert batch.same_as == {2: 0}
    assert batch.sent().ids == batch.ids[:2]
    assert batch.without({batch.ids[0]}).ids == batch.ids[1:]


def test_a_unique_key_is_checked_like_a_name():
    with pytest.raises(InvalidJob, match=r"^unique_key must be a string of 1 to 255"):
        validated(JobSpec("t", unique_key=""), LIMIT)
    with pytest.raises(InvalidJob, match=r"^unique_key must be a string"):
        validated(JobSpec("t", unique_key="a\x00"), LIMIT)


def test_a_batch_of_jobs_due_now_is_sent_as_escaped_copy_text():
    batch = prepared_many([JobSpec("a\tb", {"k": "x\\y"}, "q\n", 1, 0, None, None)], LIMIT)
    assert batch.copyable
    row = f'{batch.ids[0]}\ta\\tb\t{{"k":"x\\\\\\\\y"}}\tq\\n\t1\t\\N'
    assert list(batch.copy_chunks(None)) == [row + "\n"]
    # In a trace, each row ends with its context, escaped as COPY text is.
    assert list(batch.copy_chunks('{"tp":"a\\\\b"}')) == [row + '\t{"tp":"a\\\\\\\\b"}\n']


def test_a_big_batch_is_copied_in_chunks_that_add_up_to_its_rows_in_order():
    n = 2 * COPY_CHUNK + 50
    batch = prepared_many([JobSpec("t", {"i": i}, max_retries=i) for i in range(n)], LIMIT)
    chunks = list(batch.copy_chunks(None))
    assert [c.count("\n") for c in chunks] == [COPY_CHUNK, COPY_CHUNK, 50]
    lines = "".join(chunks).splitlines()
    assert [line.split("\t")[0] for line in lines] == batch.ids
    assert [int(line.split("\t")[-1]) for line in lines] == list(range(n))


def test_a_malformed_job_id_names_no_job():
    assert job_id_of("0B0E3C5E2F4A4C1E9D3B6A1F2E3D4C5B") == "0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b"
    with pytest.raises(JobNotFound, match="not a job id"):
        job_id_of("42")


def test_an_answer_that_cannot_be_stored_is_refused_naming_it():
    assert stored_json({"ok": True}, "answer", LIMIT) == '{"ok":true}'
    with pytest.raises(InvalidJob, match=r"^answer "):
        stored_json(math.inf, "answer", LIMIT)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800), ("2w", 1209600), (5, 5)],
)
def test_durations_read_as_their_seconds(value, seconds):
    assert parse_duration(value) == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["soon", "-1d", -5, "1000000000w", True, [1]])
def test_a_duration_that_is_not_one_or_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="older_than"):
        parse_duration(value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_duration_of_nan_or_infinity_is_refused(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_pruning_refuses_live_statuses_unknown_statuses_and_bad_batch_sizes():
    with pytest.raises(ValueError, match=r"only finished jobs .* not pending"):
        prune_params("7d", ["completed", "pending"], 10)
    with pytest.raises(ValueError, match="unknown job status 'done'"):
        prune_params("7d", ["done"], 10)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        prune_params("7d", ["failed"], 0)
    assert prune_params("7d", "failed", 10)["statuses"] == ["failed"]


@pytest.mark.parametrize("timeout", ["5", math.nan, True])
def test_a_wait_timeout_that_is_not_a_number_of_seconds_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be a number of seconds or None"):
        deadline_of(timeout)
