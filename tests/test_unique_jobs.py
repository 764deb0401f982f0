"""Unique jobs: while a job holding a key is pending, processing or paused, enqueueing another
with that key inserts nothing and returns the existing job, from any process or transaction."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import create_engine

from worker import Client, InvalidTransition, JobSpec, JobStatus
from worker.db import admin
from worker.db.admin import RetrySet, blocking


@pytest.fixture
def client(database_url):
    return Client(database_url)


def jobs_with_key(db, key: str) -> list[tuple[str, str]]:
    return db.query(
        "SELECT id::text, status FROM worker.jobs WHERE unique_key = %s ORDER BY created_at", (key,)
    )


def test_twenty_threads_enqueueing_one_key_make_one_job_and_twenty_handles_to_it(database_url, db):
    handles = []
    ready = threading.Barrier(20)

    def enqueue() -> None:
        client = Client(database_url)
        ready.wait()
        handles.append(client.enqueue("add", {"a": 1, "b": 2}, unique_key="invoice:42"))

    threads = [threading.Thread(target=enqueue) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ((job_id, _),) = jobs_with_key(db, "invoice:42")
    assert [h.job_id for h in handles] == [job_id] * 20
    assert sorted(h.duplicate for h in handles) == [False] + [True] * 19


def test_a_key_is_free_again_once_its_job_has_ended(client, db):
    first = client.enqueue("add", {}, unique_key="k")
    assert client.enqueue("add", {}, unique_key="k").job_id == first.job_id
    db.query("UPDATE worker.jobs SET status = 'completed' WHERE id = %s", (first.job_id,))
    second = client.enqueue("add", {}, unique_key="k")
    assert (second.job_id != first.job_id, second.duplicate) == (True, False)


def test_a_paused_job_holds_its_key(client, db):
    first = client.enqueue("add", {}, unique_key="k")
    db.query("UPDATE worker.jobs SET status = 'paused' WHERE id = %s", (first.job_id,))
    again = client.enqueue("add", {}, unique_key="k")
    assert (again.job_id, again.duplicate) == (first.job_id, True)


def test_enqueue_many_returns_the_holder_for_each_duplicate_in_or_out_of_the_batch(client, db):
    held = client.enqueue("add", {}, unique_key="a")
    jobs = client.enqueue_many(
        [
            JobSpec("add", unique_key="a"),
            JobSpec("add", unique_key="b"),
            JobSpec("add", unique_key="b"),
            JobSpec("add"),
        ]
    )
    assert jobs[0].job_id == held.job_id and jobs[0].duplicate
    assert jobs[2].job_id == jobs[1].job_id and jobs[2].duplicate and not jobs[1].duplicate
    assert not jobs[3].duplicate
    assert db.counts() == {"pending": 3}


def test_a_duplicate_inside_the_caller_s_transaction_returns_the_holder(database_url, client, db):
    held = client.enqueue("add", {}, unique_key="k")
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        job = client.enqueue("add", {}, unique_key="k", connection=conn)
        fresh = client.enqueue("add", {}, unique_key="other", connection=conn)
    engine.dispose()
    assert (job.job_id, job.duplicate, fresh.duplicate) == (held.job_id, True, False)
    assert len(jobs_with_key(db, "other")) == 1


def test_sql_enqueue_with_a_unique_key_returns_the_holder(database_url, client, db):
    held = client.enqueue("add", {}, unique_key="k")
    with psycopg.connect(database_url, autocommit=True) as conn:
        ((same,),) = conn.execute("SELECT worker.enqueue('add', unique_key => 'k')").fetchall()
        ((new,),) = conn.execute("SELECT worker.enqueue('add', unique_key => 'n')").fetchall()
        # A plain INSERT skips a held key with ON CONFLICT DO NOTHING.
        skipped = conn.execute(
            "INSERT INTO worker.jobs (task, unique_key) VALUES ('add', 'k') "
            "ON CONFLICT DO NOTHING RETURNING id"
        ).fetchall()
    assert str(same) == held.job_id and str(new) != held.job_id and skipped == []
    assert len(jobs_with_key(db, "k")) == 1


def test_a_job_whose_key_is_held_again_is_not_retried_and_says_why(client, db):
    failed = client.enqueue("add", {}, unique_key="k")
    db.query("UPDATE worker.jobs SET status = 'failed' WHERE id = %s", (failed.job_id,))
    holder = client.enqueue("add", {}, unique_key="k")
    with pytest.raises(InvalidTransition, match="another live job holds its unique key 'k'"):
        client.retry(failed.job_id)
    assert db.status_of(failed.job_id) == "failed" and db.status_of(holder.job_id) == "pending"


def test_a_bulk_retry_puts_back_one_job_per_free_key_and_none_whose_key_is_held(database_url, db):
    for key in ("free", "free", "held", None):
        db.insert_job(status="failed", unique_key=key, finished_at="sql:now()")
    db.insert_job(status="pending", unique_key="held")
    wanted = RetrySet(JobStatus.FAILED, None, None, cutoff=datetime.now(UTC) + timedelta(1))
    moved = blocking(database_url, "test", lambda conn: admin.retry_batch(conn, wanted, 100))
    assert sum(q.jobs for q in moved) == 2  # one of the two "free" jobs, and the one without a key
    assert db.query(
        "SELECT unique_key, status, count(*) FROM worker.jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ) == [("free", "failed", 1), ("free", "pending", 1), ("held", "failed", 1),
          ("held", "pending", 1), (None, "pending", 1)]  # fmt: skip
