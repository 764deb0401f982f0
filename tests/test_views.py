"""The admin views of migration 0002: the right rows on a seeded database, and plans that stay
on the indexes when the table holds more than a million finished jobs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from support import insert_job, insert_worker, query

from worker.db import sql
from worker.db.sql import console as console_sql

FINISHED_ROWS = 1_200_000


def rows_of(url: str, statement: str) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(statement).fetchall()


def test_queue_stats_counts_live_jobs_and_the_last_hour_per_queue(database_url):
    url = database_url
    insert_job(url, queue="a", run_at="sql:now() - interval '90 seconds'")
    insert_job(url, queue="a", run_at="sql:now() - interval '10 seconds'")
    insert_job(url, queue="a", run_at="sql:now() + interval '1 day'")  # scheduled: not waiting
    insert_job(url, queue="a", status="processing", started_at="sql:now()")
    insert_job(url, queue="a", status="paused")
    insert_job(url, queue="a", status="failed", finished_at="sql:now() - interval '59 minutes'")
    insert_job(url, queue="a", status="failed", finished_at="sql:now() - interval '61 minutes'")
    insert_job(url, queue="b", status="completed", finished_at="sql:now() - interval '20 seconds'")
    insert_job(url, queue="b", status="completed", finished_at="sql:now() - interval '2 minutes'")
    insert_job(url, queue="b", status="cancelled", finished_at="sql:now()")
    insert_job(url, queue="c", status="completed", finished_at="sql:now() - interval '2 hours'")

    a, b = rows_of(url, "SELECT * FROM worker.queue_stats ORDER BY queue")
    assert 90 <= a.pop("oldest_pending_seconds") < 600
    assert a == {
        "queue": "a",
        "pending": 3,
        "scheduled": 1,
        "processing": 1,
        "paused": 1,
        "failed_last_hour": 1,
        "completed_last_minute": 0,
    }
    assert b == {
        "queue": "b",
        "pending": 0,
        "scheduled": 0,
        "processing": 0,
        "paused": 0,
        "failed_last_hour": 0,
        "oldest_pending_seconds": 0.0,
        "completed_last_minute": 1,
    }


def test_stuck_jobs_are_processing_jobs_whose_worker_missed_its_lease(database_url):
    url = database_url
    fresh = insert_worker(url, "1 second")
    silent = insert_worker(url, "1 minute")
    insert_job(url, status="processing", worker_id=fresh, started_at="sql:now()")
    on_silent = insert_job(
        url,
        task="resize",
        status="processing",
        worker_id=silent,
        started_at="sql:now() - interval '5 minutes'",
    )
    orphan = insert_job(
        url, status="processing", worker_id=str(uuid.uuid4()), started_at="sql:now()"
    )
    insert_job(url, status="completed", worker_id=silent, finished_at="sql:now()")

    stuck = {str(r["id"]): r for r in rows_of(url, "SELECT * FROM worker.stuck_jobs")}
    assert stuck.keys() == {on_silent, orphan}
    assert stuck[on_silent]["task"] == "resize" and stuck[on_silent]["hostname"] == "host"
    assert 55 < stuck[on_silent]["heartbeat_age_seconds"] < 600
    assert stuck[on_silent]["running_seconds"] >= 299
    assert stuck[orphan]["hostname"] is None  # its worker row is gone altogether

    # The lease is the database parameter worker.lease_seconds (default 15 s).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET worker.lease_seconds = 120")
        ids = {r[0] for r in conn.execute("SELECT id::text FROM worker.stuck_jobs")}
    assert ids == {orphan}


def test_unserved_tasks_are_pending_jobs_no_live_worker_of_their_queue_registered(database_url):
    url = database_url
    # No worker at all: every pending job is listed, its queue with no live worker.
    insert_job(url, task="resize", created_at="sql:now() - interval '1 hour'")
    insert_job(url, task="resize")
    insert_job(url, task="resze")  # a typo in a plain-SQL enqueue
    insert_job(url, task="resize", queue="mail")
    insert_job(url, task="send", queue="mail", status="processing")  # not pending: not listed
    unserved = "SELECT queue, task, jobs, queue_workers FROM worker.unserved_tasks"
    listed = f"{unserved} ORDER BY queue, task"
    assert query(url, listed) == [
        ("default", "resize", 2, 0),
        ("default", "resze", 1, 0),
        ("mail", "resize", 1, 0),
    ]
    ((oldest,),) = query(
        url,
        "SELECT oldest_created_at <= now() - interval '59 minutes' FROM worker.unserved_tasks "
        "WHERE queue = 'default' AND task = 'resize'",
    )
    assert oldest

    # A worker past its own lease is not live, whatever it registered.
    insert_worker(url, "20 seconds", tasks=("resize", "resze"), lease_seconds=15)
    assert len(query(url, listed)) == 3
    # A live worker of the default queue serves resize there, not resze, and not in mail.
    insert_worker(url, "20 seconds", tasks=("resize",), lease_seconds=60)
    assert query(url, listed) == [("default", "resze", 1, 1), ("mail", "resize", 1, 0)]
    # A live worker of a release that recorded no tasks claims every task of its queues.
    insert_worker(url, "1 second", queues=("mail",), tasks=None)
    assert query(url, listed) == [("default", "resze", 1, 1)]


def test_failed_recently_lists_the_last_day_of_failures_newest_first(database_url):
    url = database_url
    older = insert_job(
        url,
        status="failed",
        error="ValueError: bad\nTraceback ...",
        finished_at="sql:now() - interval '20 hours'",
        retry_count=3,
    )
    newer = insert_job(
        url,
        task="send",
        status="failed",
        error="lost",
        finished_at="sql:now() - interval '1 minute'",
    )
    insert_job(url, status="failed", error="too old", finished_at="sql:now() - interval '25 hours'")
    insert_job(url, status="completed", finished_at="sql:now()")
    insert_job(url, status="cancelled", finished_at="sql:now()")

    rows = rows_of(
        url, "SELECT id::text, task, retry_count, error_line, error FROM worker.failed_recently"
    )
    assert [r["id"] for r in rows] == [newer, older]
    assert rows[1]["error_line"] == "ValueError: bad"
    assert rows[1]["error"] == "ValueError: bad\nTraceback ..." and rows[1]["retry_count"] == 3
    assert rows[0]["error_line"] == "lost"


def test_slowest_tasks_gives_p50_and_p95_over_the_last_hour(database_url):
    url = database_url
    query(
        url,
        """
        INSERT INTO worker.jobs (task, status, started_at, finished_at)
        SELECT 'slow', CASE WHEN s = 10 THEN 'failed' ELSE 'completed' END,
               now() - make_interval(secs => s), now()
        FROM generate_series(1, 10) AS s""",
    )
    insert_job(
        url,
        task="quick",
        status="completed",
        started_at="sql:now() - interval '2 seconds'",
        finished_at="sql:now()",
    )
    insert_job(
        url,
        task="quick",
        status="cancelled",
        started_at="sql:now() - interval '1 hour'",
        finished_at="sql:now()",
    )
    insert_job(
        url,
        task="old",
        status="completed",
        started_at="sql:now() - interval '3 hours'",
        finished_at="sql:now() - interval '2 hours'",
    )

    slow, quick = rows_of(url, "SELECT * FROM worker.slowest_tasks")
    assert slow["task"] == "slow" and slow["jobs"] == 10
    assert abs(slow["p50_seconds"] - 5.5) < 0.01
    assert abs(slow["p95_seconds"] - 9.55) < 0.01
    assert abs(slow["max_seconds"] - 10) < 0.01
    assert quick["task"] == "quick" and quick["jobs"] == 1
    assert abs(quick["p95_seconds"] - 2) < 0.01


# -- plans on a big table --------------------------------------------------------------------


def scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from scans(child)


def jobs_scans(url: str, view: str) -> tuple[list[dict[str, Any]], float]:
    """The plan nodes of `SELECT * FROM view` that read worker.jobs, and the execution time."""
    (row,) = query(url, f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM worker.{view}")
    (result,) = row[0]  # type: ignore[misc]
    nodes = [n for n in scans(result["Plan"]) if n.get("Relation Name") == "jobs"]
    return nodes, float(result["Execution Time"])


def rows_read(node: dict[str, Any]) -> float:
    kept = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    return float(kept + node.get("Rows Removed by Index Recheck", 0)) * node.get("Actual Loops", 1)


def test_admin_views_and_depth_counts_stay_on_indexes_with_millions_of_finished_rows(database_url):
    url = database_url
    # Sequential ids and times: a fast, realistic history (1 failure in 500, 1 cancel in 97),
    # finished over the last ~5 days, all more than an hour ago.
    query(
        url,
        f"""
        INSERT INTO worker.jobs (id, queue, task, status, created_at, run_at, started_at,
                                 finished_at, error)
        SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid,
               CASE i % 3 WHEN 0 THEN 'default' WHEN 1 THEN 'emails' ELSE 'reports' END,
               CASE i % 4 WHEN 0 THEN 'resize' WHEN 1 THEN 'send' WHEN 2 THEN 'bill'
                          ELSE 'sync' END,
               CASE WHEN i % 500 = 0 THEN 'failed' WHEN i % 97 = 0 THEN 'cancelled'
                    ELSE 'completed' END,
               t, t, t, t + interval '1 second',
               CASE WHEN i % 500 = 0 THEN 'RuntimeError: boom' END
        FROM generate_series(1, {FINISHED_ROWS}) AS i,
             LATERAL (SELECT now() - interval '2 hours'
                             - ({FINISHED_ROWS} - i) * interval '300 milliseconds' AS t) AS ts
    """,
    )
    # The live part and the last hour: what the views are about.
    query(
        url,
        """
        INSERT INTO worker.jobs (queue, task, status, worker_id, started_at, finished_at)
        SELECT 'default', 'send', s,
               CASE WHEN s = 'processing' THEN gen_random_uuid() END,
               CASE WHEN s IN ('processing', 'completed', 'failed') THEN now() - interval '3 s' END,
               CASE WHEN s IN ('completed', 'failed') THEN now() - interval '1 s' END
        FROM unnest(ARRAY['pending', 'processing', 'paused', 'completed', 'failed']) AS s,
             generate_series(1, 40)
    """,
    )
    query(url, "ANALYZE worker.jobs")
    (total,) = query(url, "SELECT count(*) FROM worker.jobs")[0]
    assert total == FINISHED_ROWS + 200

    # How many rows each view needs at most: the live rows and its time window.
    needed = {
        "queue_stats": 40 * 5,
        "stuck_jobs": 40,
        "unserved_tasks": 40,
        "slowest_tasks": 80,
        "failed_recently": query(
            url,
            "SELECT count(*) FROM worker.jobs "
            "WHERE status = 'failed' AND finished_at > now() - interval '24 hours'",
        )[0][0],
    }
    needed["failure_groups"] = needed["failed_recently"]
    indexes = {
        "queue_stats": {
            "jobs_runnable_idx",
            "jobs_processing_idx",
            "jobs_paused_idx",
            "jobs_finished_idx",
        },
        "stuck_jobs": {"jobs_processing_idx"},
        "unserved_tasks": {"jobs_runnable_idx"},
        "slowest_tasks": {"jobs_finished_idx"},
        "failed_recently": {"jobs_failed_idx"},
        "failure_groups": {"jobs_failed_idx"},
    }
    for view, bound in needed.items():
        nodes, elapsed_ms = jobs_scans(url, view)
        assert [n["Node Type"] for n in nodes if n["Node Type"] == "Seq Scan"] == [], view
        used = {n.get("Index Name") for n in scans_with_indexes(url, view)}
        assert indexes[view] <= used, (view, used)
        read = sum(rows_read(n) for n in nodes)
        assert read <= bound * 1.1 + 10, (view, read, bound)  # not the finished history
        assert elapsed_ms < 2000, (view, elapsed_ms)

    # Each queue's depth, which every worker's rollup samples and `client.queues()` reads, comes
    # from the live rows' partial indexes, whatever the history holds.
    for statement, params in ((console_sql.SAMPLE_DEPTH, None), (sql.QUEUE_STATES, {"name": None})):
        (row,) = query(url, f"EXPLAIN (FORMAT JSON) {statement}", params)
        plan = row[0][0]["Plan"]  # type: ignore[index]
        nodes = [n for n in scans(plan) if n.get("Relation Name") == "jobs"]
        assert nodes and all(n["Node Type"] != "Seq Scan" for n in nodes), statement
        used = {n.get("Index Name") for n in scans(plan)}  # a bitmap scan's index is its child's
        assert {"jobs_runnable_idx", "jobs_processing_idx"} <= used, (statement, used)


def scans_with_indexes(url: str, view: str) -> list[dict[str, Any]]:
    """Plan nodes naming an index (bitmap index scans carry the name, not the relation)."""
    (row,) = query(url, f"EXPLAIN (FORMAT JSON) SELECT * FROM worker.{view}")
    (result,) = row[0]  # type: ignore[misc]
    return [n for n in scans(result["Plan"]) if "Index Name" in n]
