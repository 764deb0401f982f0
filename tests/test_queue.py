"""The status machine end to end: a real worker process against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import psycopg
import pytest
from psycopg import ClientCursor
from support import Processes, query, status_of, wait_for
from support.factories import claim_params

from worker import Client, InvalidJob, JobFailed, JobStatus
from worker.db import sql
from worker.db.postgres import claim_pool


@pytest.mark.smoke
def test_job_goes_pending_processing_completed(env, database_url, processes: Processes):
    client = Client(database_url)
    job = client.enqueue("effect", {"key": "slow", "sleep": 1.0})
    assert status_of(database_url, job.job_id) == "pending"
    processes.worker(env, "testtasks")
    wait_for(lambda: status_of(database_url, job.job_id) == "processing", message="processing")
    assert job.wait_sync(timeout=20) == "done"
    row = query(
        database_url,
        "SELECT status, result, started_at <= finished_at, error FROM worker.jobs WHERE id = %s",
        (job.job_id,),
    )[0]
    assert row == ("completed", "done", True, None)


def test_sync_and_async_tasks_store_their_results(env, database_url, processes):
    client = Client(database_url)
    processes.worker(env, "testtasks")
    assert client.enqueue("add", {"a": 2, "b": 3}).wait_sync(timeout=20) == 5
    assert client.enqueue("async_double", {"n": 21}).wait_sync(timeout=20) == 42


def test_job_inserted_with_plain_sql_is_picked_up(env, database_url, processes):
    processes.worker(env, "testtasks")
    (job_id,) = query(
        database_url,
        "INSERT INTO worker.jobs (task, payload) "
        "VALUES ('add', '{\"a\": 1, \"b\": 1}') RETURNING id::text",
    )[0]
    wait_for(lambda: status_of(database_url, job_id) == "completed", timeout=20)
    assert query(database_url, "SELECT result FROM worker.jobs WHERE id = %s", (job_id,)) == [(2,)]


@pytest.mark.parametrize("queues", ["emails", "emails,reports"])
def test_worker_runs_only_its_queues_highest_priority_first(env, database_url, processes, queues):
    # One queue and several take different claim statements; both must honour the same order.
    client = Client(database_url)
    jobs = [  # (key, queue, priority), in the order enqueued
        (f"{queue}-{n}", queue, priority)
        for n, priority in enumerate((0, 5, -3, 5))
        for queue in ("emails", "reports", "other")
    ]
    for key, queue, priority in jobs:
        client.enqueue("effect", {"key": key}, queue=queue, priority=priority)
    for queue in ("emails", "reports"):  # not due yet: they wait, whatever their priority
        for priority in (10, 5, 0):
            client.enqueue("effect", {"key": "later"}, queue=queue, priority=priority, delay=3600)
    mine = [job for job in jobs if job[1] in queues.split(",")]
    processes.worker(env, "testtasks", extra={"WORKER_QUEUES": queues, "WORKER_CONCURRENCY": "1"})
    ran = "SELECT job FROM effects ORDER BY at"
    wait_for(lambda: len(query(database_url, ran)) == len(mine), timeout=20)
    time.sleep(0.3)  # a job from another queue would have run by now

    # One slot, so one job after another (jobs claimed ahead included): higher priority first,
    # then the order of enqueueing.
    expected = sorted(mine, key=lambda job: (-job[2], mine.index(job)))
    assert [row[0] for row in query(database_url, ran)] == [key for key, _, _ in expected]
    pending = "SELECT count(*) FROM worker.jobs WHERE status = 'pending'"
    assert query(database_url, pending) == [(len(jobs) - len(mine) + 6,)]


def explain_claim(url: str, statement: str, plan: str, limit: int) -> dict[str, Any]:
    """EXPLAIN ANALYZE of one claim of up to `limit` jobs, rolled back. `plan` is "for these
    values" (as PostgreSQL plans a statement run once) or "for any values": the plan the claim
    loop's session makes once and keeps (`claim_pool`)."""
    worker_id = query(
        url,
        "INSERT INTO worker.workers (id, hostname, pid, queues, concurrency) "
        "VALUES (gen_random_uuid(), 'test', 1, '{default}', 10) RETURNING id",
    )[0][0]
    params = claim_params(worker_id, ["now", "later"], limit=limit)
    text = getattr(sql, statement)
    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
    with psycopg.connect(url) as conn:
        if plan == "for these values":
            ((result,),) = conn.execute(explain + text, params).fetchall()
        else:
            names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
            numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", text)
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(f"PREPARE claim AS {numbered}")
            args = ", ".join(f"%({name})s" for name in names)
            execute = ClientCursor(conn).mogrify(f"{explain}EXECUTE claim({args})", params)
            ((result,),) = conn.execute(execute).fetchall()
        conn.rollback()
    return result[0]["Plan"]  # type: ignore[no-any-return]


def test_the_claim_loop_keeps_one_plan_for_every_claim(database_url):
    async def setting() -> str:
        pool = claim_pool(database_url)
        await pool.open()
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
                return str(row[0]) if row else ""
        finally:
            await pool.close()

    assert asyncio.run(setting()) == "force_generic_plan"


CLAIMS = pytest.mark.parametrize("statement", ["CLAIM_ONE_QUEUE", "CLAIM"])
PLANS = pytest.mark.parametrize("plan", ["for these values", "for any values"])


@pytest.mark.smoke
@CLAIMS
@PLANS
def test_a_claim_does_not_walk_the_jobs_due_later(database_url, statement, plan):
    """With 60,000 jobs due tomorrow (at three priorities) and two due now, a claim reads a
    few index pages per priority, not the whole queue."""
    query(
        database_url,
        "INSERT INTO worker.jobs (task, priority, run_at) SELECT 'later', g % 3, "
        "now() + interval '1 day' + g * interval '1 ms' FROM generate_series(1, 60000) AS g",
    )
    query(database_url, "INSERT INTO worker.jobs (task, priority) VALUES ('now', 1), ('now', 0)")
    query(database_url, "VACUUM ANALYZE worker.jobs")
    top = explain_claim(database_url, statement, plan, limit=10)
    assert top["Actual Rows"] == 2  # the two due jobs were claimed
    # The later jobs fill about 260 index pages and 380 table pages; one pass over either
    # would read them all.
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 200


@CLAIMS
@PLANS
def test_a_claim_does_not_walk_the_started_jobs_due_later(database_url, statement, plan):
    """With 60,000 snoozed jobs (started before) due tomorrow and two jobs due now, one
    started and one new, a claim still reads a few index pages, not the snoozed jobs."""
    query(
        database_url,
        "INSERT INTO worker.jobs (task, priority, run_at, started_at) SELECT 'later', g % 3, "
        "now() + interval '1 day' + g * interval '1 ms', now() FROM generate_series(1, 60000) g",
    )
    query(
        database_url,
        "INSERT INTO worker.jobs (task, priority, started_at) "
        "VALUES ('now', 1, now()), ('now', 1, NULL)",
    )
    query(database_url, "VACUUM ANALYZE worker.jobs")
    top = explain_claim(database_url, statement, plan, limit=10)
    assert top["Actual Rows"] == 2
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 200


@CLAIMS
@pytest.mark.parametrize("limit", [1, 3])
def test_work_already_started_is_claimed_before_new_work(database_url, statement, limit):
    """A job started before (snoozed, retried, rescued) and due now is claimed ahead of every
    new job of its priority, however long those have waited; a higher priority still wins."""
    query(
        database_url,
        "INSERT INTO worker.jobs (task, run_at) "
        "SELECT 'new', now() - interval '1 hour' + g * interval '1 s' "
        "FROM generate_series(1, 50) AS g",
    )
    query(database_url, "INSERT INTO worker.jobs (task, started_at) VALUES ('snoozed', now())")
    query(database_url, "INSERT INTO worker.jobs (task, priority) VALUES ('urgent', 5)")
    worker_id = query(
        database_url,
        "INSERT INTO worker.workers (id, hostname, pid, queues, concurrency) "
        "VALUES (gen_random_uuid(), 'test', 1, '{default}', 10) RETURNING id",
    )[0][0]
    params = claim_params(worker_id, ["new", "snoozed", "urgent"], limit=limit)
    rows = query(database_url, getattr(sql, statement), params)
    tasks = [row[1] for row in rows]
    assert tasks == ["urgent", "snoozed", "new"][:limit]


@CLAIMS
@PLANS
def test_a_claim_from_a_deep_backlog_reads_only_the_jobs_it_takes(database_url, statement, plan):
    """With 60,000 jobs due now, a claim of 10 reads the pages of those 10, whatever limit
    its plan was made for (one made for any limit, joined to the table, would hash it all)."""
    query(
        database_url,
        "INSERT INTO worker.jobs (task) SELECT 'now' FROM generate_series(1, 60000)",
    )
    query(database_url, "VACUUM ANALYZE worker.jobs")
    ((table_pages,),) = query(
        database_url, "SELECT relpages FROM pg_class WHERE oid = 'worker.jobs'::regclass"
    )
    top = explain_claim(database_url, statement, plan, limit=10)
    assert top["Actual Rows"] == 10
    # Marking the 10 claimed takes about 16 pages each (the row and its index entries); a
    # hash of the table would read every one of its pages.
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < min(300, table_pages // 2)


def test_task_returning_non_json_fails_with_a_clear_error(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("not_json", {})
    with pytest.raises(JobFailed, match="not JSON-serialisable"):
        job.wait_sync(timeout=20)


def test_a_cancelled_error_from_task_code_fails_the_job_and_frees_its_slot(
    env, database_url, processes
):
    processes.worker(env, "testtasks", extra={"WORKER_CONCURRENCY": "1"})
    client = Client(database_url)
    job = client.enqueue("awaits_a_cancelled_future", {}, max_retries=0)
    with pytest.raises(JobFailed, match=r"raised asyncio\.CancelledError while its job was not"):
        job.wait_sync(timeout=20)
    assert client.enqueue("add", {"a": 1, "b": 2}).wait_sync(timeout=20) == 3


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], "payload must be a JSON object"),
        ("text", "payload must be a JSON object"),
        ({"when": object()}, "not JSON-serialisable"),
        ({"x": float("nan")}, "not JSON-serialisable"),
        ({"x": "a\x00b"}, "NUL character"),
    ],
)
def test_bad_payload_is_refused_before_anything_is_written(database_url, payload, message):
    with pytest.raises(InvalidJob, match=message):
        Client(database_url).enqueue("add", payload)
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_bad_options_are_refused(database_url):
    client = Client(database_url)
    with pytest.raises(InvalidJob, match="priority"):
        client.enqueue("add", {}, priority=1000)
    with pytest.raises(InvalidJob, match="task name"):
        client.enqueue("x" * 10_000, {})
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_database_refuses_rows_out_of_range(database_url):
    import psycopg

    for column, value in [("status", "'running'"), ("priority", "500"), ("payload", "'[1]'")]:
        with pytest.raises(psycopg.errors.CheckViolation):
            query(database_url, f"INSERT INTO worker.jobs (task, {column}) VALUES ('add', {value})")
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_status_machine_statuses_are_the_documented_ones():
    assert [s.value for s in JobStatus] == [
        "pending",
        "processing",
        "completed",
        "failed",
        "paused",
        "cancelled",
        "held",
    ]
    assert json.dumps(JobStatus.COMPLETED) == '"completed"'
