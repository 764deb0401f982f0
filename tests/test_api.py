"""The HTTP edge end to end: `worker api` and `worker run` as separate processes, one database.

Events a worker publishes reach the API through PostgreSQL (`worker.job_events` + NOTIFY), so
these tests also protect the promise that progress crosses processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator

import httpx
import pytest
from psycopg import sql as pgsql
from support import Processes, free_port, query, status_of, wait_for
from support.api import TOKEN, Sse, publish_progress, sse_messages, start_api

from worker import Client
from worker.api import create_app
from worker.db.postgres import EVENTS_APPLICATION_NAME, LISTENER_NAME


def stored_event_ids(url: str, job_id: str) -> list[int]:
    rows = query(url, "SELECT id FROM worker.job_events WHERE job_id = %s ORDER BY id", (job_id,))
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


WATCHED_SEQUENCE = (
    [("spawn", "started"), ("spawn", "completed"), ("poll", "started")]
    + [("poll", "progress")] * 6
    + [
        ("poll", "completed"),
        ("verify", "started"),
        ("verify", "completed"),
        ("remove_status_file", "started"),
        ("remove_status_file", "completed"),
        ("job", "completed"),
    ]
)


# -- the live stream -------------------------------------------------------------------------


def test_sse_delivers_every_stage_event_of_a_pipeline_live_and_in_order(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    with api.client() as http:
        created = http.post(
            "/jobs",
            json={"task": "watched_export", "payload": {"ticks": 6, "tick": 0.4}},
            headers=api.auth(),
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        messages: list[Sse] = []
        statuses_while_streaming: list[str] = []
        with http.stream("GET", f"/jobs/{job_id}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for message in sse_messages(response):
                messages.append(message)
                if message.event == "message" and message.data["status"] == "progress":
                    # Seen while the job still runs: delivered live, not replayed at the end.
                    statuses_while_streaming.append(http.get(f"/jobs/{job_id}").json()["status"])
    events = [m for m in messages if m.event == "message"]
    assert [(m.data["step"], m.data["status"]) for m in events] == WATCHED_SEQUENCE
    ids = [m.id for m in events]
    assert ids == [m.data["id"] for m in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ids == stored_event_ids(database_url, job_id)
    pcts = [m.data["message"]["pct"] for m in events if m.data["status"] == "progress"]
    assert pcts == sorted(pcts) and pcts[-1] == 100
    assert [m.data["message"]["rows"] for m in events if m.data["status"] == "progress"] == [
        10,
        20,
        30,
        40,
        50,
        60,
    ]
    assert statuses_while_streaming[0] == "processing"
    # The progress events arrived spread over the polling, not in one burst at the end.
    progress_times = [m.received for m in events if m.data["status"] == "progress"]
    assert progress_times[-1] - progress_times[0] > 1.0
    assert messages[-1].event == "end"
    assert messages[-1].data == {"job_id": job_id, "status": "completed"}


def test_reconnect_with_last_event_id_misses_nothing_and_repeats_nothing(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job_id = client.enqueue("watched_export", {"ticks": 10, "tick": 0.3}).job_id
    with api.client() as http:
        first: list[Sse] = []
        with http.stream("GET", f"/jobs/{job_id}/events") as response:
            for message in sse_messages(response):
                first.append(message)
                if sum(m.data["status"] == "progress" for m in first) == 3:
                    break  # the client goes away mid-job
        time.sleep(1.0)  # events go on meanwhile
        second: list[Sse] = []
        with http.stream(
            "GET", f"/jobs/{job_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
        ) as response:
            assert response.status_code == 200
            second = list(sse_messages(response))
        assert second[-1].event == "end"
        resumed = [m.id for m in first] + [m.id for m in second if m.event == "message"]
        assert len(resumed) == len(set(resumed)), "an event was repeated"
        assert resumed == stored_event_ids(database_url, job_id), "an event was missed"
        # A stream opened after the end replays everything once, then ends.
        with http.stream("GET", f"/jobs/{job_id}/events") as response:
            replay = list(sse_messages(response))
        assert [m.id for m in replay if m.event == "message"] == resumed
        assert replay[-1].data["status"] == "completed"
        # The query parameter resumes like the header, for clients that cannot set headers.
        with http.stream("GET", f"/jobs/{job_id}/events?after={resumed[-3]}") as response:
            tail = [m.id for m in sse_messages(response) if m.event == "message"]
        assert tail == resumed[-2:]


def test_stream_cut_by_killed_database_connections_resumes_without_gaps(
    env, database_url, processes: Processes
):
    """pg_backend_kill on the API's connections mid-stream: the stream goes on (its next read
    takes a fresh connection) or ends early, and a reconnect with Last-Event-ID gets exactly
    the rest; either way no event is missed or repeated."""
    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    job_id = Client(database_url).enqueue("watched_export", {"ticks": 15, "tick": 0.3}).job_id
    received: list[Sse] = []
    attempts = 0
    with api.client() as http:
        while not received or received[-1].event != "end":
            attempts += 1
            assert attempts < 20, "the stream never reached its end"
            headers = {"Last-Event-ID": str(received[-1].id)} if received else {}
            try:
                with http.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
                    if response.status_code == 503:
                        time.sleep(0.5)  # the API noticed the database was away: retry
                        continue
                    assert response.status_code == 200, response.read()
                    for message in sse_messages(response):
                        received.append(message)
                        progress = sum(m.data.get("status") == "progress" for m in received)
                        if attempts == 1 and progress == 3:
                            killed = query(
                                database_url,
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                                "AND backend_type = 'client backend'",
                            )
                            assert killed
            except httpx.RemoteProtocolError:
                continue  # cut mid-message: resume from the last complete one
    ids = [m.id for m in received if m.event == "message"]
    assert len(ids) == len(set(ids)), "an event was repeated"
    assert ids == stored_event_ids(database_url, job_id), "an event was missed"
    assert received[-1].data["status"] == "completed"


def test_streams_after_the_apis_connections_were_cut_get_events_at_once(
    env, database_url, processes: Processes
):
    """Every database session of the API is terminated while it is idle between streams: the
    next streams read with fresh connections, none closes at once without its events."""
    api = start_api(env, processes)
    job_id = Client(database_url).enqueue("add", {"a": 1, "b": 2}).job_id  # no worker: stays
    publish_progress(database_url, job_id, 0)

    def first_event(http: httpx.Client, after: int) -> Sse:
        headers = {"Last-Event-ID": str(after)}
        with http.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
            assert response.status_code == 200, response.read()
            for message in sse_messages(response):
                return message
        raise AssertionError(f"the stream after event {after} closed without an event")

    with api.client() as http:
        # Several streams at once, so the API's pool of readers holds several connections.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(lambda _: first_event(http, 0), range(4)))
        assert {m.data["message"]["i"] for m in seen} == {0}
        last = seen[0].id
        assert last is not None
        # The listener connects on its own thread: cut only once it and a reader are both up.
        wait_for(
            lambda: (
                query(
                    database_url,
                    "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                    "WHERE application_name IN (%s, %s)",
                    (EVENTS_APPLICATION_NAME, LISTENER_NAME),
                )[0][0]
                == 2
            ),
            message="the API's reader and listener sessions",
        )
        killed = query(
            database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
        )
        assert len(killed) >= 2  # the readers and the listener at least
        for i in range(1, 4):
            publish_progress(database_url, job_id, i)
            started = time.monotonic()
            message = first_event(http, last)
            assert (message.event, message.data["message"]) == ("message", {"i": i})
            assert time.monotonic() - started < 10  # generous: a stall ends it, not a slow box
            last = message.id


def test_stream_of_a_plain_task_ends_once_the_job_is_finished(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    job_id = Client(database_url).enqueue("counts_up", {"n": 4, "tick": 0.2}).job_id
    with api.client() as http, http.stream("GET", f"/jobs/{job_id}/events") as response:
        messages = list(sse_messages(response))
    progress = [m.data["message"]["i"] for m in messages if m.event == "message"]
    assert progress == [1, 2, 3, 4]
    assert messages[-1].event == "end"
    assert messages[-1].data["status"] == "completed"


def test_stream_of_a_job_cancelled_before_it_ran_ends_without_events(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    job_id = Client(database_url).enqueue("add", {"a": 1, "b": 2}).job_id
    with api.client() as http:
        cancelled = http.post(f"/jobs/{job_id}/cancel", headers=api.auth())
        assert cancelled.json()["status"] == "cancelled"
        started = time.monotonic()
        with http.stream("GET", f"/jobs/{job_id}/events") as response:
            messages = list(sse_messages(response))
    assert [m.event for m in messages] == ["end"]
    assert messages[0].data["status"] == "cancelled"
    assert time.monotonic() - started < 20


# -- the verbs -----------------------------------------------------------------------------


def test_enqueue_get_cancel_retry_and_resume_over_http(env, database_url, processes: Processes):
    api = start_api(env, processes)
    with api.client(headers=api.auth()) as http:
        job = http.post("/jobs", json={"task": "add", "payload": {"a": 2, "b": 3}}).json()
        assert job["status"] == "pending" and job["payload"] == {"a": 2, "b": 3}
        assert http.get(f"/jobs/{job['id']}").json()["task"] == "add"
        # Not started yet: a cancel is final at once, and repeating it changes nothing.
        assert http.post(f"/jobs/{job['id']}/cancel").json() == {
            "id": job["id"],
            "status": "cancelled",
            "cancel_requested": False,
        }
        assert http.post(f"/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
        assert http.post(f"/jobs/{job['id']}/retry").json()["status"] == "pending"
        asked = http.post("/jobs", json={"task": "ask", "payload": {"question": "ship?"}}).json()
        processes.worker(env, "testtasks")
        wait_for(lambda: status_of(database_url, job["id"]) == "completed", timeout=30)
        assert http.get(f"/jobs/{job['id']}").json()["result"] == 5
        wait_for(lambda: status_of(database_url, asked["id"]) == "paused", timeout=30)
        paused = http.get(f"/jobs/{asked['id']}").json()
        assert paused["question"] == {"question": "ship?"}
        resumed = http.post(f"/jobs/{asked['id']}/resume", json={"answer": {"ship": True}})
        assert resumed.status_code == 200, resumed.text
        wait_for(lambda: status_of(database_url, asked["id"]) == "completed", timeout=30)
        assert http.get(f"/jobs/{asked['id']}").json()["result"] == {"answer": {"ship": True}}
        # Actions the status does not allow are a 409 naming the status.
        for verb in ("cancel", "retry", "resume"):
            refused = http.post(f"/jobs/{job['id']}/{verb}")
            assert refused.status_code == 409, (verb, refused.text)
            assert "completed" in refused.json()["error"]


def test_cancel_of_a_running_pipeline_is_honoured_at_its_next_boundary(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    processes.worker(env, "testtasks")
    job_id = Client(database_url).enqueue("watched_export", {"ticks": 200, "tick": 0.1}).job_id
    with api.client(headers=api.auth()) as http:
        wait_for(
            lambda: any(s["stage"] == "poll" for s in http.get(f"/jobs/{job_id}").json()["stages"]),
            message="the poll stage running",
        )
        answer = http.post(f"/jobs/{job_id}/cancel").json()
        assert answer == {"id": job_id, "status": "processing", "cancel_requested": True}
        wait_for(lambda: status_of(database_url, job_id) == "cancelled", timeout=30)
        job = http.get(f"/jobs/{job_id}").json()
    stages = {s["stage"]: s["status"] for s in job["stages"]}
    assert stages == {
        "spawn": "completed",
        "poll": "cancelled",
        "remove_status_file": "completed",
    }
    assert job["outputs"] == {"spawn": {"ticks": 200}, "remove_status_file": "removed"}


def test_list_is_filtered_and_paginated_and_stats_count_per_queue(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    client = Client(database_url)
    ids = {client.enqueue("add", {"a": i, "b": 0}, queue="emails").job_id for i in range(7)}
    ids |= {client.enqueue("effect", {"key": str(i)}).job_id for i in range(3)}
    late = client.enqueue("add", {"a": 1, "b": 1}, queue="emails", delay=3600).job_id
    Client(database_url).cancel(late)
    with api.client() as http:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params = {"queue": "emails", "status": "pending", "limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = http.get("/jobs", params=params).json()
            seen += [j["id"] for j in page["jobs"]]
            pages += 1
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert pages == 3
        assert len(seen) == len(set(seen)) == 7
        assert set(seen) == {i for i in ids if i in seen} and late not in seen
        created = [j["created_at"] for j in http.get("/jobs", params={"limit": 500}).json()["jobs"]]
        assert created == sorted(created, reverse=True) and len(created) == 11
        by_task = http.get("/jobs", params={"task": "effect"}).json()["jobs"]
        assert {j["task"] for j in by_task} == {"effect"} and len(by_task) == 3
        assert http.get("/jobs", params={"status": "cancelled"}).json()["jobs"][0]["id"] == late
        stats = http.get("/stats").json()
    queues = {q["queue"]: q for q in stats["queues"]}
    assert queues["emails"]["counts"]["pending"] == 7
    assert queues["emails"]["counts"]["cancelled"] == 1
    assert queues["default"]["counts"]["pending"] == 3
    assert queues["default"]["counts"]["completed"] == 0
    assert stats["totals"]["pending"] == 10
    assert queues["emails"]["oldest_pending_seconds"] >= 0
    db_age = query(
        database_url,
        "SELECT extract(epoch FROM now() - min(run_at)) FROM worker.jobs "
        "WHERE status = 'pending' AND queue = 'emails'",
    )[0][0]
    assert abs(queues["emails"]["oldest_pending_seconds"] - float(db_age)) < 30  # type: ignore[arg-type]


def test_healthz_openapi_and_dashboard_are_served(env, processes: Processes):
    api = start_api(env, processes)
    with api.client() as http:
        assert http.get("/healthz").json() == {"status": "ok", "database": "ok"}
        spec = http.get("/openapi.json").json()
        page = http.get("/")
    assert spec["openapi"].startswith("3.")
    expected = {
        ("get", "/healthz"),
        ("get", "/stats"),
        ("get", "/jobs"),
        ("post", "/jobs"),
        ("get", "/jobs/{id}"),
        ("get", "/jobs/{id}/events"),
        ("post", "/jobs/{id}/cancel"),
        ("post", "/jobs/{id}/resume"),
        ("post", "/jobs/{id}/retry"),
        ("get", "/queues"),
        ("post", "/queues/{name}/pause"),
        ("post", "/queues/{name}/resume"),
        ("post", "/queues/{name}/limit"),
    }
    operations = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert expected <= operations
    for method, path in expected:
        secured = "security" in spec["paths"][path][method]
        assert secured == (method == "post"), (method, path)
    assert "EnqueueBody" in spec["components"]["schemas"]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "durable-worker" in page.text and "EventSource" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_queues_are_listed_paused_resumed_and_limited_over_http(env, processes: Processes):
    api = start_api(env, processes)
    with api.client(headers=api.auth()) as http:
        first = http.post("/jobs", json={"task": "add", "queue": "q", "unique_key": "k"})
        again = http.post("/jobs", json={"task": "add", "queue": "q", "unique_key": "k"})
        paused = http.post("/queues/q/pause")
        limited = http.post("/queues/q/limit", json={"concurrency": 2, "rate": 5})
        listed = http.get("/queues").json()["queues"]
        resumed = http.post("/queues/q/resume")
        bad = http.post("/queues/q/limit", json={"concurrency": 0})
        lifted = http.post("/queues/q/limit")
    assert (first.status_code, first.json()["duplicate"]) == (201, False)
    assert (again.status_code, again.json()["duplicate"]) == (200, True)
    assert again.json()["id"] == first.json()["id"]
    assert paused.json()["paused"] is True
    assert (limited.json()["concurrency"], limited.json()["rate"]) == (2, 5.0)
    assert [(q["name"], q["paused"], q["pending"]) for q in listed] == [("q", True, 1)]
    assert resumed.json()["paused"] is False
    assert bad.status_code == 422 and "concurrency" in bad.json()["error"]
    assert (lifted.json()["concurrency"], lifted.json()["rate"]) == (None, None)


# -- refusals --------------------------------------------------------------------------------


MUTATIONS = [
    ("/jobs", {"task": "add", "payload": {"a": 1, "b": 1}}),
    ("/jobs/{id}/cancel", None),
    ("/jobs/{id}/resume", {"answer": 1}),
    ("/jobs/{id}/retry", None),
    ("/queues/q/pause", None),
    ("/queues/q/limit", {"concurrency": 1}),
]


def test_mutating_endpoints_refuse_a_missing_or_wrong_token(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    client = Client(database_url)
    job_id = client.enqueue("add", {"a": 1, "b": 1}).job_id
    client.cancel(client.enqueue("add", {"a": 1, "b": 1}).job_id)
    before = query(database_url, "SELECT id, status, cancel_requested FROM worker.jobs ORDER BY id")
    with api.client() as http:
        for path, body in MUTATIONS:
            url = path.format(id=job_id)
            missing = http.post(url, json=body)
            assert missing.status_code == 401, (url, missing.text)
            assert missing.headers["www-authenticate"].startswith("Bearer")
            assert "bearer token" in missing.json()["error"]
            for header in ("Bearer wrong-token", "Basic dXNlcjpwYXNz", f"Bearer {TOKEN}x"):
                wrong = http.post(url, json=body, headers={"Authorization": header})
                assert wrong.status_code in (401, 403), (url, header, wrong.text)
            nope = http.post(url, json=body, headers={"Authorization": "Bearer nope"})
            assert nope.status_code == 403
        # Reads need no token.
        assert http.get(f"/jobs/{job_id}").status_code == 200
        assert http.get("/jobs").status_code == 200
    after = query(database_url, "SELECT id, status, cancel_requested FROM worker.jobs ORDER BY id")
    assert after == before, "a refused request changed something"


BAD_BODIES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("{}", "task: Field required"),
    ('{"task": ""}', "task: String should have at least 1 character"),
    ('{"task": "add", "payload": [1]}', "payload: Input should be an object"),
    ('{"task": "add", "priority": 1000}', "priority: Input should be less than or equal"),
    ('{"task": "add", "priority": "5"}', "priority: Input should be a valid integer"),
    ('{"task": "add", "delay": -1}', "delay: Input should be greater than or equal to 0"),
    ('{"task": "add", "run_at": "2030-01-01T00:00:00"}', "run_at: Input should have timezone"),
    ('{"task": "add", "max_retries": -1}', "max_retries"),
    ('{"task": "add", "colour": "red"}', "colour: Extra inputs are not permitted"),
    ('{"task": "add", "payload": {"s": "a\\u0000b"}}', "NUL character"),
]


def test_bad_enqueue_bodies_get_422_with_the_reason(env, database_url, processes: Processes):
    api = start_api(env, processes)
    with api.client(headers={**api.auth(), "Content-Type": "application/json"}) as http:
        for body, reason in BAD_BODIES:
            answer = http.post("/jobs", content=body)
            assert answer.status_code == 422, (body, answer.text)
            assert reason in answer.json()["error"], (body, answer.json())
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_bad_parameters_get_422_and_unknown_jobs_404(env, database_url, processes: Processes):
    api = start_api(env, processes)
    job_id = Client(database_url).enqueue("add", {"a": 1, "b": 1}).job_id
    unknown = str(uuid.uuid4())
    with api.client(headers=api.auth()) as http:
        for params, reason in [
            ({"status": "running"}, "invalid status"),
            ({"limit": "0"}, "invalid limit"),
            ({"limit": "many"}, "not an integer"),
            ({"cursor": "garbage!"}, "invalid cursor"),
            ({"colour": "red"}, "unknown query parameter: colour"),
        ]:
            answer = http.get("/jobs", params=params)
            assert answer.status_code == 422 and reason in answer.json()["error"], params
        bad_resume = http.post(
            f"/jobs/{job_id}/resume",
            content=b"{oops",
            headers={"Content-Type": "application/json"},
        )
        assert bad_resume.status_code == 422
        bad_id = http.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "abc"})
        assert bad_id.status_code == 422 and "Last-Event-ID" in bad_id.json()["error"]
        for method, path in [
            ("GET", f"/jobs/{unknown}"),
            ("GET", f"/jobs/{unknown}/events"),
            ("POST", f"/jobs/{unknown}/cancel"),
            ("POST", f"/jobs/{unknown}/resume"),
            ("POST", f"/jobs/{unknown}/retry"),
            ("GET", "/jobs/not-a-job-id"),
            ("GET", "/jobs/not-a-job-id/events"),
        ]:
            answer = http.request(method, path)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"].startswith("no job")
        assert http.get("/no/such/page").status_code == 404


def test_api_answers_503_json_while_the_database_is_down(env, processes: Processes):
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/worker"
    api = start_api({**env, "DATABASE_URL": down}, processes)
    job_id = str(uuid.uuid4())
    with api.client(headers=api.auth()) as http:
        for method, path in [
            ("GET", "/healthz"),
            ("GET", "/stats"),
            ("GET", "/jobs"),
            ("GET", f"/jobs/{job_id}"),
            ("GET", f"/jobs/{job_id}/events"),
            ("POST", f"/jobs/{job_id}/cancel"),
        ]:
            answer = http.request(method, path)
            assert answer.status_code == 503, (method, path, answer.text)
            assert answer.json()["error"].startswith("database unavailable"), answer.text
        created = http.post("/jobs", json={"task": "add"})
        assert created.status_code == 503 and "database unavailable" in created.json()["error"]
    assert "Traceback" not in api.log()
    assert api.proc.poll() is None


def test_api_refuses_to_start_on_a_public_address_without_a_token(env, tmp_path):
    base = {k: v for k, v in env.items() if k != "WORKER_API_TOKEN"}
    port = free_port()
    for host in ("0.0.0.0", "::", "example.org"):
        done = subprocess.run(
            [sys.executable, "-m", "worker", "api", "--host", host, "--port", str(port)],
            env=base,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 2, (host, done.stdout, done.stderr)
        assert "WORKER_API_TOKEN is not set" in done.stderr
        assert "Traceback" not in done.stderr


def test_api_serves_a_public_address_with_a_token_and_loopback_without(env, processes: Processes):
    public = start_api(env, processes, host="0.0.0.0")
    with public.client() as http:
        assert http.get("/healthz").status_code == 200
        assert http.post("/jobs", json={"task": "add"}).status_code == 401
    local = start_api(env, processes, token=None)
    with local.client() as http:
        # No token configured (loopback only): actions need none.
        created = http.post("/jobs", json={"task": "add", "payload": {"a": 1, "b": 2}})
        assert created.status_code == 201, created.text


# -- cross-site requests, bad values, sizes, privileges, metrics, shutdown ------------------


def test_a_tokenless_api_refuses_cross_site_posts_and_takes_same_site_ones(
    env, database_url, processes: Processes
):
    """Without a token, any web page the user opens could POST to the local API: a form or a
    no-CORS fetch (a non-JSON content type), another site's fetch (a foreign Origin), or a
    page on a name re-pointed at 127.0.0.1 (a foreign Host)."""
    api = start_api(env, processes, token=None)
    port = api.base.rsplit(":", 1)[1]
    job = json.dumps({"task": "send_email"})
    pending = Client(database_url).enqueue("add", {"a": 1, "b": 1}).job_id
    with api.client() as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            form = http.post("/jobs", content=job, headers={"Content-Type": content_type})
            assert form.status_code == 415, form.text
            assert "application/json" in form.json()["error"]
        untyped = http.post("/jobs", content=job)
        assert untyped.status_code == 415, untyped.text
        empty_form = http.post(f"/jobs/{pending}/cancel", headers={"Content-Type": "text/plain"})
        assert empty_form.status_code == 415, empty_form.text
        for origin in ("https://evil.example", f"http://evil.example:{port}", "null"):
            foreign = http.post("/jobs", content=job, headers=_json_from(origin))
            assert foreign.status_code == 403, (origin, foreign.text)
            assert "cross-site" in foreign.json()["error"]
        other_port = http.post("/jobs", content=job, headers=_json_from("http://127.0.0.1:1"))
        assert other_port.status_code == 403, other_port.text
        rebound = http.post(
            "/jobs",
            content=job,
            headers={**_json_from(f"http://evil.example:{port}"), "Host": f"evil.example:{port}"},
        )
        assert rebound.status_code == 403, rebound.text
        assert "loopback" in rebound.json()["error"]
        assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(1,)]
        assert status_of(database_url, pending) == "pending"

        # The dashboard's own requests: same origin, JSON, "{}" as the body of an action.
        page = http.get("/").text
        assert '"Content-Type"] = "application/json"' in page
        same = http.post("/jobs", content=job, headers=_json_from(api.base))
        assert same.status_code == 201, same.text
        by_name = http.post(
            "/jobs",
            content=job,
            headers={**_json_from(f"http://localhost:{port}"), "Host": f"localhost:{port}"},
        )
        assert by_name.status_code == 201, by_name.text
        cancelled = http.post(f"/jobs/{pending}/cancel", content="{}", headers=_json_from(api.base))
        assert cancelled.status_code == 200, cancelled.text
        # Programs send no Origin; an action needs no body at all.
        assert http.post("/jobs", json={"task": "add"}).status_code == 201
        assert http.post(f"/jobs/{pending}/retry").status_code == 200


def _json_from(origin: str) -> dict[str, str]:
    return {"Origin": origin, "Content-Type": "application/json"}


VALUES_THE_DATABASE_CANNOT_HOLD = [
    ('{"task": "a\\u0000b"}', "task", "NUL"),
    ('{"task": "add", "queue": "q\\u0000"}', "queue", "NUL"),
    ('{"task": "a\\ud800b"}', "task", "surrogate"),
    ('{"task": "add", "payload": {"k": "\\udfff"}}', "payload", "surrogate"),
    ('{"task": "add", "max_retries": 1099511627776}', "max_retries", "less than or equal"),
    ('{"task": "add", "delay": 1e300}', "delay", "less than or equal"),
    ('{"task": "add", "delay": 3e11}', "delay", "less than or equal"),
    ('{"task": "add", "run_at": "0001-01-01T00:00:00+14:00"}', "run_at", "between the years"),
    ('{"task": "add", "run_at": "9999-12-31T23:00:00-14:00"}', "run_at", "between the years"),
    ('{"task": "add", "run_at": "0001-06-01T00:00:00Z"}', "run_at", "between the years"),
]


def test_values_the_database_cannot_hold_get_422_naming_the_field_and_store_nothing(
    env, database_url, processes: Processes
):
    api = start_api(env, processes, extra={"WORKER_MAX_PAYLOAD_BYTES": "1000"})
    job_id = Client(database_url).enqueue("add", {"a": 1, "b": 1}).job_id
    headers = {**api.auth(), "Content-Type": "application/json"}
    with api.client(headers=headers) as http:
        for body, field_, reason in VALUES_THE_DATABASE_CANNOT_HOLD:
            answer = http.post("/jobs", content=body)
            assert answer.status_code == 422, (body, answer.text)
            error = answer.json()["error"]
            assert error.startswith(f"invalid body: {field_}:"), (body, error)
            assert reason in error, (body, error)
        for body in ('{"task": "add", "delay": 1e400}', '{"task": "add", "payload": {"x": NaN}}'):
            answer = http.post("/jobs", content=body)
            assert answer.status_code == 422 and "not valid JSON" in answer.json()["error"], body
        for name in ("queue", "task"):
            answer = http.get("/jobs", params={name: "a\x00b"})
            assert answer.status_code == 422, (name, answer.text)
            assert answer.json()["error"].startswith(f"invalid {name}:")
        assert http.get(f"/jobs/{job_id}/events?after={2**63}").status_code == 422
        resume = f"/jobs/{job_id}/resume"
        for body, reason in [
            ('{"answer": NaN}', "not valid JSON"),
            ('{"answer": [Infinity]}', "not valid JSON"),
            ('{"answer": "a\\u0000b"}', "answer: value is not storable: it contains a NUL"),
            (json.dumps({"answer": "x" * 1000}), "answer: is 1002 bytes encoded; the limit is"),
        ]:
            answer = http.post(resume, content=body)
            assert answer.status_code == 422, (body, answer.text)
            assert reason in answer.json()["error"], (body, answer.json())
        # Right at the bounds, a job is taken.
        edge = {"task": "add", "max_retries": 2**31 - 1, "run_at": "9998-12-31T00:00:00Z"}
        assert http.post("/jobs", json=edge).status_code == 201
        listed = http.get("/jobs")
        assert listed.status_code == 200, listed.text
    rows = query(database_url, "SELECT count(*), max(run_at) < '10000-01-01' FROM worker.jobs")
    assert rows == [(2, True)]
    assert query(database_url, "SELECT answer FROM worker.jobs WHERE id = %s", (job_id,)) == [
        (None,)
    ]
    assert "Traceback" not in api.log()


def test_a_value_the_database_refuses_is_a_json_422_not_a_500(
    env, database_url, processes: Processes
):
    """A row written by SQL with a due time Python cannot read (year 11533) used to turn
    every listing into a text/plain 500."""
    api = start_api(env, processes)
    (row,) = query(
        database_url,
        "INSERT INTO worker.jobs (task, run_at) VALUES ('far', '11533-01-01T00:00:00Z') "
        "RETURNING id",
    )
    with api.client() as http:
        for path in ("/jobs", f"/jobs/{row[0]}"):
            answer = http.get(path)
            assert answer.status_code == 422, (path, answer.text)
            assert answer.headers["content-type"] == "application/json"
            assert "refused by the database" in answer.json()["error"], answer.text
    assert "Traceback" not in api.log()


def _raw_request(base: str, head: str, chunks: Iterable[bytes] = ()) -> tuple[str, float]:
    """Send `head`, then `chunks` until the server answers; its answer, and how long it
    took."""
    host, port = base.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        for chunk in chunks:
            if select.select([sock], [], [], 0.005)[0]:
                break  # answered already
            sock.sendall(chunk)
        answer = b""
        while not _complete(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer.decode(errors="replace"), time.monotonic() - started


def _complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def test_a_body_over_twice_the_payload_limit_is_refused_with_413_before_it_is_read(
    env, database_url, processes: Processes
):
    api = start_api(env, processes, extra={"WORKER_MAX_PAYLOAD_BYTES": "1000"})
    auth = f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
    # 66 MB announced and never sent: the answer comes at once, from the length alone.
    answer, took = _raw_request(
        api.base,
        f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: 66000000\r\n\r\n",
    )
    assert answer.startswith("HTTP/1.1 413"), answer
    assert "WORKER_MAX_PAYLOAD_BYTES" in answer and took < 5
    # Chunked: no length announced, so it is counted as it arrives.
    chunks = [b'{"task": "add", "payload": {"s": "'] + [b"x" * 8192] * 20
    framed = (f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks)
    answer, took = _raw_request(
        api.base,
        f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n",
        framed,
    )
    assert answer.startswith("HTTP/1.1 413"), answer
    with api.client(headers=api.auth()) as http:
        # Within the body limit but over the payload limit: the payload check names it.
        over = http.post("/jobs", json={"task": "add", "payload": {"s": "x" * 1500}})
        assert over.status_code == 422 and "WORKER_MAX_PAYLOAD_BYTES" in over.json()["error"]
        fits = http.post("/jobs", json={"task": "add", "payload": {"s": "é" * 300}})
        assert fits.status_code == 201, fits.text
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(1,)]
    assert api.proc.poll() is None


def test_metrics_are_served_at_slash_metrics_like_the_other_reads(
    env, database_url, processes: Processes
):
    api = start_api(env, processes)
    Client(database_url).enqueue("add", {"a": 1, "b": 1}, queue="emails")
    with api.client() as http:
        answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    lines = answer.text.splitlines()
    assert "durable_worker_database_up 1.0" in lines
    assert 'durable_worker_jobs{queue="emails",status="pending"} 1.0' in lines


@pytest.fixture
def client_login(database_url: str) -> Iterator[str]:
    """A login in the README's `worker_client` role (enqueue and read only); its URL."""
    name, password = f"t_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    query(
        database_url,
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE worker_client").format(
            pgsql.Identifier(name), pgsql.Literal(password)
        ),
    )
    scheme, rest = database_url.split("://", 1)
    yield f"{scheme}://{name}:{password}@{rest.split('@', 1)[1]}"
    query(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
        (name,),
    )
    query(database_url, pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(name)))
    query(database_url, pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


def test_a_database_role_that_may_not_change_jobs_gets_403_not_a_500(
    env, database_url, client_login: str, processes: Processes
):
    api = start_api({**env, "DATABASE_URL": client_login}, processes)
    client = Client(database_url)
    failed = client.enqueue("add").job_id
    query(database_url, "UPDATE worker.jobs SET status = 'failed' WHERE id = %s", (failed,))
    with api.client(headers=api.auth()) as http:
        created = http.post("/jobs", json={"task": "add"})
        assert created.status_code == 201, created.text  # worker_client may enqueue
        job_id = created.json()["id"]
        for path, body in [
            (f"/jobs/{job_id}/cancel", None),
            (f"/jobs/{failed}/retry", None),
            (f"/jobs/{job_id}/resume", {"answer": 1}),
        ]:
            refused = http.post(path, json=body)
            assert refused.status_code == 403, (path, refused.text)
            assert "database role may not change jobs" in refused.json()["error"]
        assert http.get(f"/jobs/{job_id}").json()["status"] == "pending"
    assert status_of(database_url, failed) == "failed"
    assert "Traceback" not in api.log()
    api.proc.kill()
    api.proc.wait(timeout=10)


def test_shutdown_closes_every_connection_the_app_opened(database_url):
    def others() -> int:
        rows = query(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()",
        )
        return int(rows[0][0])  # type: ignore[call-overload]

    app = create_app(database_url, TOKEN)

    async def serve_and_stop() -> int:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1", headers=auth
            ) as http:
                created = await http.post("/jobs", json={"task": "add"})  # a direct connection
                assert created.status_code == 201, created.text
                assert (await http.get("/jobs")).status_code == 200  # the engine's pool
            return others()

    assert asyncio.run(serve_and_stop()) >= 2
    wait_for(lambda: others() == 0, timeout=10, message="the app's connections to close")
