"""`worker api`, `worker demo` and `worker bench`: the programs that serve or show off.

What this does not do: the HTTP edge is `worker.api`'s, the demo `worker.demo`'s, the
measurements `worker.bench`'s; these commands read the settings and start them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from worker.cli.output import err, out
from worker.cli.session import checked_url, ensure_schema, settings, url


def demo(
    jobs: Annotated[int, typer.Option(help="How many quick jobs to enqueue.")] = 40,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Run on this PostgreSQL (migrated) instead of the embedded server, on a "
            "queue of its own, 'demo'. DATABASE_URL alone is not used.",
        ),
    ] = None,
) -> None:
    """Run the demo on the embedded server: a batch of jobs, live progress, a summary.

    Example: worker demo --jobs 100
    """
    from worker.demo import run_demo

    s = settings()
    if database_url is not None:
        database_url = checked_url("--database-url", database_url)
        ensure_schema(database_url, migrate=False)
    run_demo(s, quick_jobs=jobs, on=database_url)


def bench(
    jobs: Annotated[int, typer.Option(min=1, help="Jobs to enqueue in bulk and drain.")] = 5000,
    single: Annotated[int, typer.Option(min=1, help="Jobs enqueued one per call.")] = 1000,
    latency_jobs: Annotated[int, typer.Option(min=1, help="Jobs for the latency test.")] = 100,
    concurrency: Annotated[int, typer.Option(min=1, help="The drain's concurrency.")] = 10,
) -> None:
    """Measure enqueue, drain and latency on your database, then delete every job it made.

    Runs in a queue of its own with a task of its own: your workers and jobs are not touched.

    Example: DATABASE_URL=postgresql://app@db/app worker bench --jobs 20000
    """
    from worker.bench import render, run_bench

    s = settings()
    database = url()
    ensure_schema(database, migrate=not s.database_url)
    results = run_bench(
        database,
        s,
        jobs=jobs,
        single_jobs=single,
        latency_jobs=latency_jobs,
        concurrency=concurrency,
        console=err,
    )
    out.print(render(results))


def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
) -> None:
    """Serve the HTTP edge: REST, live job events (SSE) and the dashboard at /.

    Without WORKER_API_TOKEN it serves on a loopback address only.

    Example: WORKER_API_TOKEN=s3cret worker api --host 0.0.0.0 --port 8000
    """
    from worker.api import check_bind, serve

    s = settings()
    check_bind(host, s.api_token)
    database = url()
    if not s.database_url:
        ensure_schema(database, migrate=True)
    serve(database, host=host, port=port, token=s.api_token, log_level=s.log_level)
