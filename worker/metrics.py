"""Prometheus metrics: what the queue holds (read from the database on each scrape) and what a
worker process did (counted as it happens).

Two places serve them:

- a worker, on `WORKER_METRICS_PORT` when it is set (`worker run` calls `instrument` and
  `serve`): its own counters and histograms plus the database series;
- the HTTP API, at `/metrics`, through `asgi_app(url)`: the database series (the API runs no
  jobs, so its job counters stay empty).

The database series are the same whichever process serves them; with several workers, take
`max by (queue, status)` rather than `sum`. A worker's `task` label names only the tasks it
has registered (its `worker.tasks.REGISTRY`), the only ones it claims. A job naming any other
task, as anyone who can enqueue may write, waits and is counted by `..._jobs_unserved`, whose
series are bounded (`UNSERVED_SERIES`). No counter has a `_created` series (the
`prometheus_client` setting is turned off on import).

Counting reads only live rows and the last hour (the `worker.queue_stats` view), never the
finished history, so a scrape stays cheap on a table with millions of finished jobs. Terminal
statuses have no gauge for that reason: count them with the `..._total` counters. What this
does not do: it keeps no history and raises no alert; Prometheus does both.

    from worker import metrics
    app.add_route("/metrics", metrics.asgi_app(database_url))      # Starlette
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.db import admin
from worker.db.admin import Conn, blocking
from worker.db.errors import DATABASE_ERRORS
from worker.models import JobStatus

if TYPE_CHECKING:
    from worker.db.driver import RecordedOutcome

PREFIX = "durable_worker"
# Jobs run from milliseconds to an hour; the claim is one indexed statement.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# Terminal statuses have no gauge: counting them would read the finished history.
LIVE_STATUSES = (JobStatus.PENDING, JobStatus.PROCESSING, JobStatus.PAUSED)
SCRAPE_TIMEOUT_MS = 5000
# The `task` label of a job whose task this worker has not registered.
UNREGISTERED_TASK = "(unregistered)"
# Unserved jobs get a series per queue and task for this many pairs, the most jobs first; the
# rest of a queue's are summed under UNSERVED_OTHERS: anyone who may enqueue can name any task.
UNSERVED_SERIES = 20
UNSERVED_OTHERS = "(others)"

# Each `_created` series doubles a counter's series for a timestamp Prometheus does not need.
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Scrape:
    """What one scrape read: the queues, the stuck jobs per queue, the live workers, and the
    pending jobs no live worker serves."""

    queues: list[admin.QueueRow]
    stuck: list[admin.QueueCount]
    live_workers: int
    unserved: list[admin.UnservedTask]


class DatabaseCollector(Collector):
    """Reads the queue's state on every scrape (one short connection, four small queries).

    >>> REGISTRY.register(DatabaseCollector(url, lease_seconds=15))     # doctest: +SKIP
    """

    def __init__(self, url: str, lease_seconds: float = 15.0) -> None:
        self.url = url
        self.lease_seconds = lease_seconds

    def describe(self) -> Iterable[Any]:
        return []  # nothing is known before the first read; skip registry name checks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            f"{PREFIX}_database_up", "1 when the last scrape could read the worker schema."
        )
        try:
            scrape = self._read()
        except DATABASE_ERRORS:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            f"{PREFIX}_jobs", "Jobs now in each live status.", labels=["queue", "status"]
        )
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth", "Pending jobs due now (not scheduled later).", labels=["queue"]
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_queue_oldest_pending_seconds",
            "How long the oldest due pending job has waited.",
            labels=["queue"],
        )
        failed = GaugeMetricFamily(
            f"{PREFIX}_jobs_failed_last_hour",
            "Jobs that ran out of retries in the last hour.",
            labels=["queue"],
        )
        throughput = GaugeMetricFamily(
            f"{PREFIX}_jobs_completed_last_minute",
            "Jobs completed in the last minute.",
            labels=["queue"],
        )
        stuck_jobs = GaugeMetricFamily(
            f"{PREFIX}_jobs_stuck",
            "Processing jobs whose worker missed its heartbeat (see worker.stuck_jobs).",
            labels=["queue"],
        )
        for row in scrape.queues:
            for status in LIVE_STATUSES:
                jobs.add_metric([row.queue, status.value], getattr(row, status.value))
            depth.add_metric([row.queue], row.pending - row.scheduled)
            age.add_metric([row.queue], row.oldest_pending_seconds)
            failed.add_metric([row.queue], row.failed_last_hour)
            throughput.add_metric([row.queue], row.completed_last_minute)
        for stuck in scrape.stuck:
            stuck_jobs.add_metric([stuck.queue], stuck.jobs)
        live = GaugeMetricFamily(
            f"{PREFIX}_workers", "Workers whose heartbeat is within the lease."
        )
        live.add_metric([], scrape.live_workers)
        yield from (jobs, depth, age, failed, throughput, stuck_jobs, live)
        yield _unserved(scrape.unserved)

    def _read(self) -> Scrape:
        return blocking(
            self.url,
            "durable-worker-metrics",
            self._ask,
            connect_timeout=5,
            application_name="durable-worker-metrics",
            options=f"-c statement_timeout={SCRAPE_TIMEOUT_MS}",
        )

    async def _ask(self, conn: Conn) -> Scrape:
        return Scrape(
            await admin.queue_stats(conn),
            await admin.stuck_by_queue(conn, self.lease_seconds),
            await admin.count_live_workers(conn, self.lease_seconds),
            await admin.unserved_tasks(conn),
        )


def _unserved(rows: list[admin.UnservedTask]) -> GaugeMetricFamily:
    """Pending jobs per queue and task that no live worker of the queue registered; past
    `UNSERVED_SERIES` pairs (rows come most jobs first), the rest per queue as one series."""
    gauge = GaugeMetricFamily(
        f"{PREFIX}_jobs_unserved",
        "Pending jobs whose task no live worker of their queue registered "
        "(see worker.unserved_tasks).",
        labels=["queue", "task"],
    )
    others: dict[str, int] = {}
    for row in rows[UNSERVED_SERIES:]:
        others[row.queue] = others.get(row.queue, 0) + row.jobs
    for row in rows[:UNSERVED_SERIES]:
        gauge.add_metric([row.queue, row.task], row.jobs)
    for queue, n in sorted(others.items()):
        gauge.add_metric([queue, UNSERVED_OTHERS], n)
    return gauge


class WorkerMetrics:
    """A worker process's counters and histograms, fed by the daemon's observer hooks.

    Each update is a dictionary lookup and an addition per job: the cost is O(batch) on the
    event loop, never a query.
    """

    def __init__(
        self, registry: CollectorRegistry = REGISTRY, known_tasks: Container[str] = ()
    ) -> None:
        # The label values a job row may bring: only registered tasks get one of their own.
        self.known_tasks = known_tasks
        labels = ["queue", "task"]
        self.completed = Counter(
            f"{PREFIX}_jobs_completed", "Jobs completed by this worker.", labels, registry=registry
        )
        self.failed = Counter(
            f"{PREFIX}_jobs_failed",
            "Jobs that ran out of retries (or could not run) on this worker.",
            labels,
            registry=registry,
        )
        self.duration = Histogram(
            f"{PREFIX}_job_duration_seconds",
            "Duration of each attempt, from claim to recorded outcome.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.claim = Histogram(
            f"{PREFIX}_claim_duration_seconds",
            "Round trip of one claim statement (claim latency).",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.claimed = Counter(
            f"{PREFIX}_jobs_claimed", "Jobs claimed by this worker.", registry=registry
        )

    def claimed_jobs(self, seconds: float, jobs: int) -> None:
        """The `Worker.on_claim` hook."""
        self.claim.observe(seconds)
        if jobs:
            self.claimed.inc(jobs)

    def recorded(self, rows: list[RecordedOutcome]) -> None:
        """The `Worker.on_recorded` hook: the outcomes just written."""
        for row in rows:
            task = row.task if row.task in self.known_tasks else UNREGISTERED_TASK
            if row.duration is not None:
                self.duration.labels(row.queue, task).observe(row.duration)
            if row.status == JobStatus.COMPLETED:
                self.completed.labels(row.queue, task).inc()
            elif row.status == JobStatus.FAILED:
                self.failed.labels(row.queue, task).inc()


_instrumented: WorkerMetrics | None = None
_lock = threading.Lock()


def instrument(worker: Any) -> WorkerMetrics:
    """Count what `worker` (a `worker.daemon.Worker`) claims and records.

    >>> instrument(worker); serve(9100, url)                    # doctest: +SKIP
    """
    global _instrumented
    with _lock:
        if _instrumented is None:
            _instrumented = WorkerMetrics(known_tasks=worker.registry)
        metrics = _instrumented
    worker.on_claim = metrics.claimed_jobs
    worker.on_recorded = metrics.recorded
    return metrics


def registry_for(url: str, lease_seconds: float = 15.0) -> CollectorRegistry:
    """This process's metrics plus the database series for `url`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(REGISTRY)
    registry.register(DatabaseCollector(url, lease_seconds))
    return registry


def render(url: str, lease_seconds: float = 15.0) -> tuple[bytes, str]:
    """One scrape as (body, content type), for a web framework's own route.

    >>> body, content_type = render("postgresql://app@db/app")   # doctest: +SKIP
    """
    return generate_latest(registry_for(url, lease_seconds)), CONTENT_TYPE_PLAIN_0_0_4


class MetricsApp:
    """An ASGI app serving one scrape per request; the database read runs in a thread, so the
    event loop never waits on it. Mount it at any path (it ignores the path)."""

    def __init__(self, url: str, lease_seconds: float = 15.0) -> None:
        self.registry = registry_for(url, lease_seconds)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await asyncio.to_thread(generate_latest, self.registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def asgi_app(url: str, lease_seconds: float = 15.0) -> MetricsApp:
    """The `/metrics` endpoint for an ASGI server (the API mounts it).

    >>> from starlette.routing import Route                      # doctest: +SKIP
    >>> Route("/metrics", asgi_app(database_url))                # doctest: +SKIP
    """
    return MetricsApp(url, lease_seconds)


class MetricsServer:
    """The worker's own HTTP endpoint (`WORKER_METRICS_PORT`), on a background thread."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown()
            self._server.server_close()
        self._thread.join(timeout=5)


def serve(port: int, url: str, lease_seconds: float = 15.0, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve `/metrics` on `addr:port` until `stop()` (all interfaces by default, so a
    Prometheus in another container can scrape it).

    >>> server = serve(9100, url); ...; server.stop()            # doctest: +SKIP
    """
    server, thread = start_http_server(port, addr, registry_for(url, lease_seconds))
    return MetricsServer(server, thread)
