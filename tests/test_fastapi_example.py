"""The FastAPI example (examples/fastapi_app/): a request enqueues in its own SQLAlchemy
session, so the job exists only if the request's transaction commits; `worker.api` mounted
inside the app serves the job, its lifespan run by `worker.api.lifespan`.

The app runs in Starlette's test client (its lifespan included) against the suite's real
PostgreSQL; the job runs in this process (`drain`), with the example's task.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from support import query
from support.tracing import parent_of, recording

import examples.fastapi_app.tasks  # noqa: F401  (registers the ship_order pipeline)
from examples.fastapi_app.app import create_app
from worker.testing import drain


@pytest.fixture
def http(database_url) -> Iterator[TestClient]:
    with TestClient(create_app(database_url)) as client:
        yield client


def jobs(url: str) -> list[tuple[str, str]]:
    return [(str(i), t) for i, t in query(url, "SELECT id, task FROM worker.jobs")]


def test_order_a_request_commits_enqueues_its_job_and_the_mounted_api_serves_it(http, database_url):
    placed = http.post("/orders", json={"id": 1, "item": "widget", "quantity": 2})
    assert placed.status_code == 201
    job_id = placed.json()["job"]
    assert jobs(database_url) == [(job_id, "ship_order")]
    assert http.get(f"/worker/jobs/{job_id}").json()["status"] == "pending"

    (done,) = drain(url=database_url)
    assert (done.job_id, done.result) == (job_id, {"order": 1, "label": "SHIP-000001"})
    assert http.get(f"/worker/jobs/{job_id}").json()["status"] == "completed"
    # The mounted API's progress stream, which needs its event bus started by its lifespan.
    stream = http.get(f"/worker/jobs/{job_id}/events")
    assert stream.status_code == 200
    assert "event: end" in stream.text
    assert query(database_url, "SELECT units FROM stock") == [(8,)]


def test_order_refused_after_its_enqueue_leaves_neither_order_nor_job(http, database_url):
    refused = http.post("/orders", json={"id": 2, "item": "widget", "quantity": 11})
    assert refused.status_code == 409
    assert jobs(database_url) == []
    assert query(database_url, "SELECT count(*) FROM orders") == [(0,)]
    assert query(database_url, "SELECT units FROM stock") == [(10,)]


def test_mounted_job_api_without_a_token_refuses_changes_on_a_host_not_loopback(http, database_url):
    posted = http.post("/worker/jobs", json={"task": "ship_order", "payload": {"order": 5}})
    assert posted.status_code == 403  # the test client's host is "testserver"
    assert jobs(database_url) == []


def test_traced_request_and_its_job_make_one_trace_from_the_request_to_each_stage(database_url):
    app = create_app(database_url)
    FastAPIInstrumentor.instrument_app(app)  # a span per request, as a traced app has
    with recording() as exporter:
        with TestClient(app) as http:
            placed = http.post("/orders", json={"id": 6, "item": "widget", "quantity": 1})
        assert placed.status_code == 201
        drain(url=database_url)
        spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.name == "POST /orders"]
    (attempt,) = [s for s in spans if s.name == "run ship_order"]
    stages = sorted((s for s in spans if s.name.startswith("stage ")), key=lambda s: s.start_time)
    assert [s.name for s in stages] == ["stage book_carrier", "stage print_label"]
    assert {s.context.trace_id for s in [request, attempt, *stages]} == {request.context.trace_id}
    assert parent_of(attempt) == request.context.span_id
    assert {parent_of(s) for s in stages} == {attempt.context.span_id}


def test_mounted_job_api_closes_its_connections_when_the_app_stops(database_url):
    def client_connections() -> int:
        (row,) = query(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name LIKE 'durable-worker%%'",
        )
        return int(row[0])

    with TestClient(create_app(database_url, token="s3cret")) as http:
        placed = http.post("/orders", json={"id": 3, "item": "widget", "quantity": 1})
        # A job enqueued through the mounted API, on its own client's connections.
        posted = http.post(
            "/worker/jobs",
            json={"task": "ship_order", "payload": {"order": 4}},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert (placed.status_code, posted.status_code) == (201, 201)
        assert client_connections() > 0
    assert client_connections() == 0
