"""Retries: a failing job runs again after an exponential backoff, then fails for good."""

from __future__ import annotations

import re

import pytest
from support import Processes, query, wait_for

from worker import Client, JobFailed
from worker.daemon import next_poll_delay


def attempts(url: str, key: str) -> list[float]:
    rows = query(
        url, "SELECT extract(epoch FROM at) FROM effects WHERE job = %s ORDER BY at", (key,)
    )
    return [float(r[0]) for r in rows]


def test_failed_job_retries_after_backoff_then_fails(env, database_url, processes: Processes):
    processes.worker(
        env,
        "testtasks",
        extra={"WORKER_RETRY_BACKOFF_BASE": "0.4", "WORKER_RETRY_BACKOFF_MAX": "10"},
    )
    job = Client(database_url).enqueue("always_fails", {"key": "k"}, max_retries=2)
    with pytest.raises(JobFailed, match="this task always fails") as raised:
        job.wait_sync(timeout=30)
    assert isinstance(raised.value, RuntimeError)
    assert job.retry_count == 2
    times = attempts(database_url, "k")
    assert len(times) == 3  # the first attempt and two retries
    # Backoff with jitter: base * 2**n * [0.5, 1.0], so at least 0.2 s then 0.4 s.
    assert times[1] - times[0] >= 0.2
    assert times[2] - times[1] >= 0.4
    assert "RuntimeError: this task always fails" in (job.error or "")
    assert "Traceback" in (job.error or "")


@pytest.mark.smoke
def test_job_succeeds_on_a_later_attempt(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("fails_then_succeeds", {"key": "k", "failures": 2})
    assert job.wait_sync(timeout=30) == "succeeded on attempt 3"
    assert job.retry_count == 2
    assert len(attempts(database_url, "k")) == 3


def test_sql_inserted_job_uses_worker_max_retries(env, database_url, processes):
    processes.worker(env, "testtasks", extra={"WORKER_MAX_RETRIES": "1"})
    (job_id,) = query(
        database_url,
        "INSERT INTO worker.jobs (task, payload) "
        "VALUES ('always_fails', '{\"key\": \"sql\"}') RETURNING id::text",
    )[0]
    wait_for(
        lambda: (
            query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", (job_id,))[0][0]
            == "failed"
        ),
        timeout=30,
    )
    assert len(attempts(database_url, "sql")) == 2
    assert query(database_url, "SELECT max_retries, retry_count FROM worker.jobs") == [(None, 1)]


def test_max_retries_zero_fails_on_first_error(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("always_fails", {"key": "once"}, max_retries=0)
    with pytest.raises(JobFailed):
        job.wait_sync(timeout=30)
    assert len(attempts(database_url, "once")) == 1


def test_poll_delay_doubles_up_to_the_maximum_and_resets_on_work():
    delays = [0.05]
    for _ in range(8):
        delays.append(next_poll_delay(delays[-1], False, 0.05, 2.0))
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert next_poll_delay(2.0, True, 0.05, 2.0) == 0.05


def test_idle_worker_backs_off_then_resets_when_work_arrives(env, database_url, processes):
    proc = processes.worker(
        env,
        "testtasks",
        extra={"WORKER_LOG_LEVEL": "DEBUG", "WORKER_POLL_MIN": "0.05", "WORKER_POLL_MAX": "0.8"},
    )
    polls = re.compile(r"idle: next poll in ([0-9.]+) s")
    wait_for(lambda: len(polls.findall(processes.log(proc))) >= 7, timeout=30, message="polls")
    Client(database_url).enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=20)
    seen = [float(x) for x in polls.findall(processes.log(proc))]
    doubling = [0.05, 0.1, 0.2, 0.4, 0.8, 0.8]
    start = next(i for i in range(len(seen)) if seen[i : i + len(doubling)] == doubling)
    after = seen[start + len(doubling) :]
    assert 0.05 in after, f"the delay never went back to WORKER_POLL_MIN after work: {seen}"


def test_polling_alone_drains_the_queue_when_notifications_are_lost(env, database_url, processes):
    query(database_url, "DROP TRIGGER jobs_notify ON worker.jobs")
    processes.worker(env, "testtasks", extra={"WORKER_POLL_MAX": "0.3"})
    client = Client(database_url)
    jobs = [client.enqueue("add", {"a": i, "b": 0}) for i in range(20)]
    assert [j.wait_sync(timeout=30) for j in jobs] == list(range(20))
