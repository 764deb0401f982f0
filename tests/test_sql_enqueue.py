"""Enqueue from any SQL client: `worker.enqueue(...)` and a plain INSERT both wake idle workers."""

from __future__ import annotations

import time

import psycopg
import pytest
from support import Processes, query, wait_for

from worker import Client, JobSpec

FUNCTION = "SELECT worker.enqueue('add', '{\"a\": 1, \"b\": 2}')::text"
INSERT = (
    "INSERT INTO worker.jobs (task, payload) VALUES ('add', '{\"a\": 3, \"b\": 4}') "
    "RETURNING id::text"
)


def start_delay(url: str, job_id: str) -> float:
    """Seconds from the insert to the claim, on the database's clock, once the job is done."""
    wait_for(
        lambda: (
            query(url, "SELECT status FROM worker.jobs WHERE id = %s", (job_id,))[0][0]
            == "completed"
        ),
        timeout=30,
        message=f"job {job_id} completed",
    )
    row = query(
        url,
        "SELECT extract(epoch FROM started_at - created_at) FROM worker.jobs WHERE id = %s",
        (job_id,),
    )
    return float(row[0][0])  # type: ignore[arg-type]


def test_sql_function_plain_insert_and_bulk_enqueue_wake_an_idle_worker(
    env, database_url, processes: Processes
):
    # This worker polls only every 10 s: a job started within 2 s was woken by the NOTIFY.
    processes.worker(env, "testtasks", extra={"WORKER_POLL_MIN": "10", "WORKER_POLL_MAX": "10"})
    wait_for(lambda: query(database_url, "SELECT count(*) FROM worker.workers")[0][0])
    time.sleep(1.0)  # past its first claim: the next poll is about 9 s away
    (via_function,) = query(database_url, FUNCTION)[0]
    assert start_delay(database_url, str(via_function)) < 2.0
    # Each claim that finds work sets the next poll 10 s later again.
    (via_insert,) = query(database_url, INSERT)[0]
    assert start_delay(database_url, str(via_insert)) < 2.0
    (via_bulk,) = Client(database_url).enqueue_many([JobSpec("add", {"a": 5, "b": 6})])
    assert start_delay(database_url, via_bulk.job_id) < 2.0
    results = query(
        database_url,
        "SELECT result FROM worker.jobs WHERE id = ANY(%s::uuid[]) ORDER BY created_at",
        ([str(via_function), str(via_insert), via_bulk.job_id],),
    )
    assert results == [(3,), (7,), (11,)]


def test_sql_function_takes_named_options_and_returns_the_id(database_url):
    (job_id,) = query(
        database_url,
        "SELECT worker.enqueue('send_email', '{\"to\": \"ada@example.com\"}', "
        "queue => 'emails', priority => 5, run_at => now() + interval '1 hour')::text",
    )[0]
    row = query(
        database_url,
        "SELECT task, payload, queue, priority, status, max_retries, "
        "round(extract(epoch FROM run_at - now()) / 60) FROM worker.jobs WHERE id = %s",
        (job_id,),
    )
    assert row == [
        ("send_email", {"to": "ada@example.com"}, "emails", 5, "pending", None, 60),
    ]


def test_sql_function_insert_sends_its_notification_only_at_commit(database_url):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN worker_jobs")
        with psycopg.connect(database_url) as conn:
            conn.execute("SELECT worker.enqueue('add', '{}', queue => 'q1')")
            assert list(listener.notifies(timeout=0.5)) == []
            conn.rollback()
            assert list(listener.notifies(timeout=0.5)) == []
            conn.execute("SELECT worker.enqueue('add', '{}', queue => 'q2')")
            conn.commit()
        assert [n.payload for n in listener.notifies(timeout=1.0)] == ["q2"]


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("SELECT worker.enqueue('add', '[1, 2]')", psycopg.errors.CheckViolation),
        ("SELECT worker.enqueue('add', '{}', priority => 500)", psycopg.errors.CheckViolation),
        ("SELECT worker.enqueue('', '{}')", psycopg.errors.CheckViolation),
        ("SELECT worker.enqueue('add', 'not json')", psycopg.errors.InvalidTextRepresentation),
    ],
)
def test_sql_function_refuses_bad_input(database_url, statement, error):
    with pytest.raises(error):
        query(database_url, statement)
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_copy_into_the_jobs_table_also_notifies_once_per_queue(database_url):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN worker_jobs")
        with psycopg.connect(database_url) as conn:
            with conn.cursor().copy("COPY worker.jobs (task, payload, queue) FROM STDIN") as copy:
                for i in range(1000):
                    copy.write_row(("add", f'{{"a": {i}, "b": 0}}', f"q{i % 2}"))
            conn.commit()
        assert sorted(n.payload for n in listener.notifies(timeout=1.0)) == ["q0", "q1"]
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(1000,)]
