"""Prometheus metrics: a worker's endpoint after real jobs ran, and the API's ASGI app."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
import uuid
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from support import Processes, free_port, query, wait_for
from support.api import start_api

from worker import Client, metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> Samples:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return parse(response.read().decode())
    except OSError:
        return {}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_worker_serves_the_documented_series_after_jobs_ran(env, database_url, processes):
    port = free_port()
    processes.worker(env, "testtasks", extra={"WORKER_METRICS_PORT": str(port)})
    client = Client(database_url)
    for i in range(3):
        assert client.enqueue("add", {"a": i, "b": 1}).wait_sync(timeout=30) == i + 1
    failing = client.enqueue("always_fails", {}, max_retries=0)
    asking = client.enqueue("ask", {})
    wait_for(lambda: failing.refresh().status == "failed", timeout=30, message="failed")
    wait_for(lambda: asking.refresh().status == "paused", timeout=30, message="paused")
    # A queue nobody serves: one job waiting since 30 s, one due tomorrow.
    query(
        database_url,
        "INSERT INTO worker.jobs (task, queue, run_at) VALUES "
        "('add', 'idle', now() - interval '30 seconds'), ('add', 'idle', now() + interval '1 day')",
    )

    m = wait_for(
        lambda: (s := scrape(port)) and value(s, "durable_worker_jobs_claimed_total") == 5 and s,
        timeout=30,
        message="5 jobs claimed in the metrics",
    )
    assert isinstance(m, dict)
    add = {"queue": "default", "task": "add"}
    assert value(m, "durable_worker_jobs_completed_total", **add) == 3
    assert value(m, "durable_worker_jobs_failed_total", queue="default", task="always_fails") == 1
    assert value(m, "durable_worker_jobs_failed_total", **add) is None
    assert value(m, "durable_worker_job_duration_seconds_count", **add) == 3
    assert value(m, "durable_worker_job_duration_seconds_bucket", le="+Inf", **add) == 3
    assert value(m, "durable_worker_job_duration_seconds_bucket", le="60.0", **add) == 3
    claims = value(m, "durable_worker_claim_duration_seconds_count")
    assert claims is not None and claims >= 4  # 5 jobs, claimed in one or more statements
    assert value(m, "durable_worker_claim_duration_seconds_sum") > 0  # type: ignore[operator]

    # Read from the database on each scrape.
    assert value(m, "durable_worker_database_up") == 1
    assert value(m, "durable_worker_jobs", queue="default", status="paused") == 1
    assert value(m, "durable_worker_jobs", queue="default", status="pending") == 0
    assert value(m, "durable_worker_jobs", queue="idle", status="pending") == 2
    assert value(m, "durable_worker_queue_depth", queue="idle") == 1
    oldest = value(m, "durable_worker_queue_oldest_pending_seconds", queue="idle")
    assert oldest is not None and 30 <= oldest < 600
    assert value(m, "durable_worker_jobs_failed_last_hour", queue="default") == 1
    assert value(m, "durable_worker_jobs_completed_last_minute", queue="default") == 3
    assert value(m, "durable_worker_workers") == 1
    assert value(m, "durable_worker_jobs_stuck", queue="default") is None
    # No live worker serves the idle queue: its jobs are unserved, by task.
    assert value(m, "durable_worker_jobs_unserved", queue="idle", task="add") == 2
    assert value(m, "durable_worker_jobs_unserved", queue="default", task="add") is None

    # Counters grow with the work; the gauges follow the database.
    client.enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=30)
    client.resume(asking.id, "yes")
    asking.wait_sync(timeout=30)
    later = wait_for(
        lambda: (
            (s := scrape(port))
            and value(s, "durable_worker_jobs_completed_total", **add) == 4
            and s
        ),
        timeout=30,
        message="a fourth completion",
    )
    assert isinstance(later, dict)
    assert value(later, "durable_worker_jobs", queue="default", status="paused") == 0


def test_worker_refuses_a_metrics_port_in_use(env, processes: Processes):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = processes.worker(env, "testtasks", extra={"WORKER_METRICS_PORT": str(port)})
        assert proc.wait(timeout=120) == 1
    log = processes.log(proc)
    assert f"error: cannot serve metrics on WORKER_METRICS_PORT={port}" in log
    assert "Traceback" not in log


def get(app: Any, path: str) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            return await http.get(path)

    return asyncio.run(call())


def test_api_metrics_app_serves_the_database_series(database_url):
    query(
        database_url,
        "INSERT INTO worker.jobs (task, queue) VALUES ('add', 'mail'), "
        "('add', 'mail'), ('add', 'web')",
    )
    response = get(metrics.asgi_app(database_url), "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    m = parse(response.text)
    assert value(m, "durable_worker_database_up") == 1
    assert value(m, "durable_worker_jobs", queue="mail", status="pending") == 2
    assert value(m, "durable_worker_queue_depth", queue="web") == 1
    assert value(m, "durable_worker_workers") == 0

    body, content_type = metrics.render(database_url)
    assert content_type.startswith("text/plain")
    assert value(parse(body.decode()), "durable_worker_jobs", queue="mail", status="pending") == 2


def test_metrics_report_an_unreachable_database_instead_of_failing():
    m = parse(get(metrics.asgi_app("postgresql://nobody@127.0.0.1:9/none"), "/").text)
    assert value(m, "durable_worker_database_up") == 0
    assert not [name for name, _ in m if name == "durable_worker_jobs"]


def test_made_up_task_names_are_never_claimed_and_add_a_bounded_set_of_series(
    env, database_url, processes: Processes
):
    """Anyone who may enqueue can name any task. A worker claims none it has not registered,
    so its counters label its own tasks only; the unserved gauge names the tasks of the
    `UNSERVED_SERIES` pairs with the most jobs and sums the rest of a queue's under one label."""
    port = free_port()
    processes.worker(env, "testtasks", extra={"WORKER_METRICS_PORT": str(port)})
    api = start_api(env, processes)
    made_up = [f"made_up_{uuid.uuid4().hex}" for _ in range(metrics.UNSERVED_SERIES + 5)]
    with api.client(headers=api.auth()) as http:
        for task in [made_up[0], *made_up]:  # the first twice: the most jobs
            assert http.post("/jobs", json={"task": task}).status_code == 201
    # The worker claims past them: a job enqueued after them runs.
    assert Client(database_url).enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=30) == 2

    m = wait_for(
        lambda: (s := scrape(port)) and value(s, "durable_worker_jobs_claimed_total") == 1 and s,
        timeout=30,
        message="the one job claimed in the metrics",
    )
    assert isinstance(m, dict)
    tasks = {dict(labels).get("task") for name, labels in m if "unserved" not in name} - {None}
    assert tasks == {"add"}
    unserved = {
        dict(labels)["task"]: n for (name, labels), n in m.items() if name.endswith("_unserved")
    }
    assert unserved[made_up[0]] == 2
    assert len(unserved) == metrics.UNSERVED_SERIES + 1
    assert unserved[metrics.UNSERVED_OTHERS] == 5
    assert sum(unserved.values()) == len(made_up) + 1
    with api.client() as http:
        served_by_api = parse(http.get("/metrics").text)
    for samples in (m, served_by_api):
        assert samples and not [name for name, _ in samples if name.endswith("_created")]
