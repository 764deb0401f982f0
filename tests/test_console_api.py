"""The console's API: tabs, search, bulk verbs over a filter, the job view, workers, charts.

Against a real PostgreSQL, through the ASGI app in this process; the rollup is written by the
workers' duty, run here once per call.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from starlette.testclient import TestClient
from support import insert_job, insert_worker, query, status_of
from support.duties import roll_up

from worker.api import create_app
from worker.daemon.plugins.rollup import stage_plans
from worker.stages.pipeline import Pipeline

TOKEN = "console-token-7c1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def http(database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(database_url, TOKEN), base_url="http://127.0.0.1") as client:
        yield client


def listed(http: TestClient, **params: str) -> list[str]:
    answer = http.get("/console/jobs", params=params)
    assert answer.status_code == 200, answer.text
    return [job["id"] for job in answer.json()["jobs"]]


def test_each_tab_lists_the_jobs_in_that_state_and_counts_them(http, database_url):
    due = insert_job(database_url, "mail")
    ahead = insert_job(database_url, "mail", run_at="sql:now() + interval '1 hour'")
    again = insert_job(database_url, "mail", retry_count=1, error="Timeout: smtp")
    running = insert_job(database_url, "mail", status="processing", started_at="sql:now()")
    paused = insert_job(database_url, "mail", status="paused")
    failed = insert_job(database_url, "mail", status="failed", finished_at="sql:now()")
    done = insert_job(database_url, "mail", status="completed", finished_at="sql:now()")

    assert listed(http, tab="queued") == [due]
    assert listed(http, tab="scheduled") == [ahead]
    assert listed(http, tab="retrying") == [again]
    assert listed(http, tab="running") == [running]
    assert listed(http, tab="paused") == [paused]
    assert listed(http, tab="failed") == [failed]
    assert set(listed(http, tab="all")) == {due, ahead, again, running, paused, failed, done}
    counts = http.get("/console/jobs").json()["counts"]
    assert counts == dict.fromkeys(
        ["running", "queued", "scheduled", "retrying", "paused", "failed"], 1
    )


def test_search_matches_the_id_task_payload_and_error(http, database_url):
    by_payload = insert_job(database_url, "mail", payload='{"to": "ada@example.com"}')
    by_error = insert_job(
        database_url, "mail", status="failed", error="SMTPError: Mailbox FULL\nTraceback..."
    )
    by_task = insert_job(database_url, "resize_image")
    other = insert_job(database_url, "mail")

    assert listed(http, q="ADA@example") == [by_payload]
    assert listed(http, q="mailbox full") == [by_error]
    assert listed(http, q="resize") == [by_task]
    # The random tail of a UUIDv7 tells one job from another; so does its search.
    assert listed(http, q=other[-12:]) == [other]
    assert listed(http, q="50%_off") == []  # `%` and `_` are plain characters
    rows = http.get("/console/jobs", params={"q": "mailbox"}).json()["jobs"]
    assert rows[0]["error"] == "SMTPError: Mailbox FULL"  # the first line only


def test_task_and_since_narrow_the_failures(http, database_url):
    noon = datetime.now(UTC) - timedelta(hours=1)
    recent = insert_job(database_url, "charge", status="failed", finished_at="sql:now()")
    insert_job(database_url, "charge", status="failed", finished_at="sql:now() - interval '3h'")
    insert_job(database_url, "refund", status="failed", finished_at="sql:now()")

    assert listed(http, tab="failed", task="charge", since=noon.isoformat()) == [recent]
    assert http.get("/console/jobs", params={"since": "noon"}).status_code == 422
    assert http.get("/console/jobs", params={"since": "2026-12-02T12:00"}).status_code == 422
    assert http.get("/console/jobs", params={"tab": "stuck"}).status_code == 422


def test_pages_follow_one_another_without_repeating_a_job(http, database_url):
    ids = {insert_job(database_url, "mail") for _ in range(5)}
    first = http.get("/console/jobs", params={"limit": 3}).json()
    second = http.get("/console/jobs", params={"limit": 3, "cursor": first["next_cursor"]}).json()
    seen = [j["id"] for j in first["jobs"]] + [j["id"] for j in second["jobs"]]
    assert sorted(seen) == sorted(ids) and second["next_cursor"] is None


def bulk(http: TestClient, verb: str, expected: int, **where: str) -> dict[str, object]:
    answer = http.post(
        "/console/bulk", json={"verb": verb, "filter": where, "expected": expected}, headers=AUTH
    )
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_bulk_retry_moves_only_the_filter_s_failures_once_confirmed(http, database_url):
    noon = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    today = [
        insert_job(database_url, "charge", status="failed", finished_at="sql:now()")
        for _ in range(3)
    ]
    before = insert_job(
        database_url, "charge", status="failed", finished_at="sql:now() - interval '3h'"
    )
    other = insert_job(database_url, "refund", status="failed", finished_at="sql:now()")
    where = {"tab": "failed", "task": "charge", "since": noon}

    count = http.get("/console/bulk", params={"verb": "retry", **where}).json()
    assert count == {"verb": "retry", "jobs": 3}
    # Confirmed for fewer than now match: refused, nothing moved.
    short = http.post(
        "/console/bulk", json={"verb": "retry", "filter": where, "expected": 2}, headers=AUTH
    )
    assert short.status_code == 409 and "matches 3" in short.json()["error"]
    assert {status_of(database_url, j) for j in today} == {"failed"}

    assert bulk(http, "retry", 3, **where) == {
        "verb": "retry",
        "changed": 3,
        "unchanged": 0,
        "more": False,
    }
    assert {status_of(database_url, j) for j in today} == {"pending"}
    assert status_of(database_url, before) == "failed"
    assert status_of(database_url, other) == "failed"


def test_bulk_cancel_cancels_waiting_jobs_and_asks_running_ones_to_stop(http, database_url):
    waiting = insert_job(database_url, "export", queue="reports")
    running = insert_job(
        database_url, "export", queue="reports", status="processing", started_at="sql:now()"
    )
    elsewhere = insert_job(database_url, "export", queue="mail")

    assert bulk(http, "cancel", 2, queue="reports")["changed"] == 2
    assert status_of(database_url, waiting) == "cancelled"
    assert query(
        database_url, "SELECT status, cancel_requested FROM worker.jobs WHERE id = %s", (running,)
    ) == [("processing", True)]
    assert status_of(database_url, elsewhere) == "pending"
    # Asked once: a second cancel over the same filter finds nothing left to ask.
    assert (
        http.get("/console/bulk", params={"verb": "cancel", "queue": "reports"}).json()["jobs"] == 0
    )


def test_a_bulk_verb_needs_the_token(http, database_url):
    failed = insert_job(database_url, "charge", status="failed", finished_at="sql:now()")
    body = {"verb": "retry", "filter": {"tab": "failed"}, "expected": 1}
    assert http.post("/console/bulk", json=body).status_code == 401
    assert (
        http.post("/console/bulk", json=body, headers={"Authorization": "Bearer x"}).status_code
        == 403
    )
    assert status_of(database_url, failed) == "failed"


def test_the_job_view_names_the_worker_holding_the_job(http, database_url):
    worker = insert_worker(database_url, heartbeat_age="40 seconds", hostname="box-7", pid=4242)
    held = insert_job(
        database_url, "export", status="processing", worker_id=worker, started_at="sql:now()"
    )
    view = http.get(f"/console/jobs/{held}").json()
    assert view["worker"]["hostname"] == "box-7" and view["worker"]["pid"] == 4242
    assert view["worker"]["heartbeat_age"] >= 39
    assert view["stages"] is None  # no worker published the task's stages
    assert http.get(f"/console/jobs/{'0' * 8}-0000-7000-8000-{'0' * 12}").status_code == 404

    workers = http.get("/console/workers").json()
    (row,) = workers["workers"]
    assert row["hostname"] == "box-7" and [j["id"] for j in row["jobs"]] == [held]
    assert workers["lease_seconds"] > 0


def test_the_console_names_the_tasks_whose_jobs_no_live_worker_can_run(http, database_url):
    insert_job(database_url, "resze")
    insert_job(database_url, "resze")
    insert_job(database_url, "resize", queue="mail")
    none_running = http.get("/console/unserved").json()
    assert [
        (t["queue"], t["task"], t["jobs"], t["queue_workers"]) for t in none_running["tasks"]
    ] == [
        ("default", "resze", 2, 0),
        ("mail", "resize", 1, 0),
    ]
    assert none_running["tasks"][0]["oldest_created_at"] <= none_running["now"]
    # A live worker of both queues that registered `resize`: the typo alone is left.
    insert_worker(database_url, queues=("default", "mail"), tasks=("resize",))
    (left,) = http.get("/console/unserved").json()["tasks"]
    assert (left["task"], left["queue_workers"]) == ("resze", 1)


def test_the_workers_publish_each_pipeline_s_stages_for_the_job_view(http, database_url):
    flow = Pipeline("console_flow")

    @flow.stage
    def fetch(ctx: object) -> int:
        return 1

    @flow.stage
    def store(ctx: object) -> int:
        return 2

    @flow.stage(rule="all_done")
    def tidy(ctx: object) -> None:
        return None

    assert stage_plans({"console_flow": flow}) == {"console_flow": (["fetch", "store"], ["tidy"])}
    roll_up(database_url, {"console_flow": flow})
    job = insert_job(database_url, "console_flow")
    view = http.get(f"/console/jobs/{job}").json()
    assert view["stages"] == ["fetch", "store"] and view["cleanups"] == ["tidy"]


def test_the_job_view_gives_the_retry_limit_that_applies_to_the_job(http, database_url):
    # As a worker registering `limited` with `max_retries=2` publishes it.
    query(database_url, "INSERT INTO worker.task_limits (task, max_retries) VALUES ('limited', 2)")
    by_task = insert_job(database_url, "limited")
    own = insert_job(database_url, "limited", max_retries=0)
    unknown = insert_job(database_url, "never_run")
    assert http.get(f"/console/jobs/{by_task}").json()["retry_limit"] == 2
    assert http.get(f"/console/jobs/{own}").json()["retry_limit"] == 0
    assert http.get(f"/console/jobs/{unknown}").json()["retry_limit"] is None


def test_the_rollup_counts_each_minute_once_however_often_it_runs(http, database_url):
    for _ in range(3):
        insert_job(database_url, "mail", status="completed", finished_at="sql:now()")
    insert_job(database_url, "mail", status="failed", finished_at="sql:now()")
    for _ in range(4):
        insert_job(database_url, "mail", queue="reports")
    assert roll_up(database_url, times=2) == [True, True]

    chart = http.get("/console/charts", params={"window": "hour"}).json()
    assert chart["bucket_seconds"] == 60 and len(chart["outcomes"]) == 60
    assert sum(p["completed"] for p in chart["outcomes"]) == 3
    assert sum(p["failed"] for p in chart["outcomes"]) == 1
    assert chart["outcomes"][-1]["completed"] == 3  # the current minute is the last
    assert chart["depth"]["reports"][-1]["pending"] == 4
    day = http.get("/console/charts", params={"window": "day"}).json()
    assert len(day["outcomes"]) == 144 and sum(p["completed"] for p in day["outcomes"]) == 3


def test_the_rollup_forgets_old_minutes_and_a_minute_not_sampled_reads_none(http, database_url):
    query(
        database_url,
        "INSERT INTO worker.job_rollups (minute, queue, task, pending) VALUES "
        "(date_trunc('minute', now()) - interval '3 days', 'old', 'x', 1), "
        "(date_trunc('minute', now()) - interval '30 minutes', 'reports', 'render', 2)",
    )
    roll_up(database_url)
    assert query(database_url, "SELECT count(*) FROM worker.job_rollups WHERE queue = 'old'") == [
        (0,)
    ]
    depth = http.get("/console/charts").json()["depth"]["reports"]
    assert [p["pending"] for p in depth].count(2) == 1
    assert depth[0]["pending"] is None  # no worker sampled that minute


def test_a_bulk_retry_leaves_a_job_whose_unique_key_is_taken(http, database_url):
    held = insert_job(database_url, "charge", unique_key="order-1")
    failed = insert_job(
        database_url, "charge", status="failed", finished_at="sql:now()", unique_key="order-1"
    )
    free = insert_job(database_url, "charge", status="failed", finished_at="sql:now()")
    assert bulk(http, "retry", 2, tab="failed") == {
        "verb": "retry",
        "changed": 1,
        "unchanged": 1,
        "more": True,
    }
    assert (
        status_of(database_url, failed) == "failed" and status_of(database_url, free) == "pending"
    )
    assert status_of(database_url, held) == "pending"


def test_one_worker_rolls_up_at_a_time(database_url):
    with psycopg.connect(database_url, autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('worker.job_rollups', 0))")
        assert roll_up(database_url) == [False]
    assert roll_up(database_url) == [True]


def test_the_runner_role_writes_the_rollup_and_the_client_role_reads_it(database_url):
    def may(role: str, table: str, privilege: str) -> bool:
        rows = query(
            database_url, "SELECT has_table_privilege(%s, %s, %s)", (role, table, privilege)
        )
        return bool(rows[0][0])

    for table in ("worker.job_rollups", "worker.task_stages"):
        assert may("worker_runner", table, "INSERT") and may("worker_runner", table, "UPDATE")
        assert may("worker_client", table, "SELECT")
        assert not may("worker_client", table, "INSERT")
