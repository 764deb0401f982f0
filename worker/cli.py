"""The `worker` program: the daemon, migrations, and the operator's verbs.

Errors are one red line and exit code 1 (bad settings and usage: 2), never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from worker.settings import Settings, SettingsError, load_settings_or_exit

app = typer.Typer(
    help="durable-worker: background jobs on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The embedded PostgreSQL (used when DATABASE_URL is unset).")
app.add_typer(db_app, name="db")
out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


class CliError(Exception):
    """An error the user can act on: printed as one line, exit code 1."""


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def friendly(fn: F) -> F:
    """Turn every expected failure into one red line instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import psycopg
        import sqlalchemy.exc

        from worker.client import InvalidJob, InvalidTransition, JobNotFound
        from worker.db.embedded import EmbeddedServerError
        from worker.logs import scrub

        try:
            return fn(*args, **kwargs)
        except SettingsError as exc:
            raise fail(str(exc), 2) from None
        except (
            CliError,
            InvalidJob,
            InvalidTransition,
            JobNotFound,
            EmbeddedServerError,
            ValueError,
        ) as exc:
            raise fail(scrub(str(exc))) from None
        except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise fail(f"cannot reach the database: {scrub(first)}") from None
        except (psycopg.errors.UndefinedTable, sqlalchemy.exc.ProgrammingError) as exc:
            if "worker.jobs" in str(exc) or "does not exist" in str(exc):
                raise fail("the worker schema is missing: run `worker migrate` first") from None
            raise

    return wrapper  # type: ignore[return-value]


def settings() -> Settings:
    return load_settings_or_exit()


def url() -> str:
    from worker.db.engine import database_url

    return database_url(settings())


def client() -> Any:
    from worker.client import Client

    return Client(url())


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None


def ensure_schema(database: str, *, migrate: bool) -> None:
    """Migrate when asked (or on the embedded default); otherwise insist the schema exists."""
    import psycopg

    from worker.db import migrate as migrations

    if migrate:
        migrations.upgrade(database)
        return
    with psycopg.connect(database) as conn:
        found = conn.execute("SELECT to_regclass('worker.jobs')").fetchone()
    if not found or found[0] is None:
        raise CliError("the worker schema is missing: run `worker migrate` first")


# -- the daemon -------------------------------------------------------------------------------


@app.command()
@friendly
def run(
    modules: Annotated[list[str], typer.Argument(help="Modules defining your tasks.")],
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Jobs at once.")] = None,
    migrate: Annotated[bool, typer.Option(help="Apply migrations before starting.")] = False,
) -> None:
    """Run the worker daemon until SIGTERM or Ctrl-C.

    Example: worker run myapp.tasks --queues default,emails --concurrency 20
    """
    from worker.daemon import Worker
    from worker.logs import configure

    s = settings()
    if queues is not None:
        s.queues = [q.strip() for q in queues.split(",") if q.strip()]
    if concurrency is not None:
        s.concurrency = concurrency
    configure(s.log_level, s.log_format)
    sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CliError(f"cannot import task module {name!r}: {exc}") from None
    database = url()
    ensure_schema(database, migrate=migrate or not s.database_url)
    worker = Worker(database, s)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        await worker.run()

    asyncio.run(main())
    if any(t.name.startswith("worker-task") and t.is_alive() for t in threading.enumerate()):
        # A sync task ignoring its timeout still runs; its job was handed back already.
        sys.stderr.flush()
        os._exit(0)


@app.command()
@friendly
def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of running it.")
    ] = False,
) -> None:
    """Create or upgrade the `worker` schema (Alembic `upgrade head`).

    Example: worker migrate --sql > schema.sql
    """
    from worker.db import migrate as migrations

    if sql:
        out.print(migrations.upgrade_sql(), highlight=False, markup=False)
        return
    migrations.upgrade(url())
    out.print("[green]schema is up to date[/green]")


# -- jobs -------------------------------------------------------------------------------------


@app.command()
@friendly
def enqueue(
    task: Annotated[str, typer.Argument(help="The task name.")],
    payload: Annotated[str, typer.Option(help="The payload, a JSON object.")] = "{}",
    queue: Annotated[str, typer.Option()] = "default",
    priority: Annotated[int, typer.Option(help="Higher runs first (-100..100).")] = 0,
    delay: Annotated[float, typer.Option(help="Seconds before it may run.")] = 0.0,
    max_retries: Annotated[int | None, typer.Option()] = None,
    wait: Annotated[bool, typer.Option(help="Wait and print the result.")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after.")] = None,
) -> None:
    """Enqueue a job and print its id.

    Example: worker enqueue send_email --payload '{"to": "ada@example.com"}' --wait
    """
    from worker.client import JobError

    job = client().enqueue(
        task,
        parse_json(payload, "--payload"),
        queue=queue,
        priority=priority,
        delay=delay,
        max_retries=max_retries,
    )
    out.print(job.job_id, highlight=False)
    if not wait:
        return
    try:
        result = job.wait_sync(timeout=timeout)
    except JobError as exc:
        raise fail(
            f"job {job.status}: {(job.error or '').splitlines()[0] if job.error else ''}"
        ) from exc
    if not job.status.is_terminal:
        raise fail(f"timed out; the job is {job.status}")
    out.print_json(json.dumps(result))


@app.command()
@friendly
def cancel(job_id: str) -> None:
    """Cancel a job (cooperatively, if it is running).

    Example: worker cancel 0b0e3c5e-...
    """
    status = client().cancel(job_id)
    if status.is_terminal and status != "cancelled":
        out.print(f"job {job_id} already {status}: nothing to cancel")
    elif status == "cancelled":
        out.print(f"job {job_id} cancelled")
    else:
        out.print(f"job {job_id} is {status}: cancel requested, it stops at its next boundary")


@app.command()
@friendly
def resume(
    job_id: str,
    answer: Annotated[str, typer.Option(help="The answer, as JSON.")] = "null",
) -> None:
    """Resume a paused job with an answer to its question.

    Example: worker resume 0b0e3c5e-... --answer '{"approved": true}'
    """
    job = client().resume(job_id, parse_json(answer, "--answer"))
    out.print(f"job {job.job_id} resumed: {job.status}")


@app.command()
@friendly
def retry(job_id: str) -> None:
    """Run a failed or cancelled job again.

    Example: worker retry 0b0e3c5e-...
    """
    job = client().retry(job_id)
    out.print(f"job {job.job_id} is {job.status} again")


@app.command()
@friendly
def show(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show one job: payload, result or error, stages and outputs.

    Example: worker show 0b0e3c5e-... --json
    """
    job = client().get(job_id)
    if as_json:
        data = {k: v for k, v in job.__dict__.items() if k != "client"}
        out.print_json(json.dumps(data, default=str))
        return
    table = Table(show_header=False, box=None)
    for name in (
        "job_id",
        "task",
        "queue",
        "status",
        "priority",
        "retry_count",
        "created_at",
        "started_at",
        "finished_at",
    ):
        table.add_row(name, str(getattr(job, name)))
    table.add_row("payload", json.dumps(job.payload))
    if job.result is not None:
        table.add_row("result", json.dumps(job.result))
    if job.question is not None:
        table.add_row("question", json.dumps(job.question))
    if job.error:
        table.add_row("error", job.error)
    out.print(table)
    if job.stages:
        stages = Table("stage", "kind", "status", "attempt", "output / error")
        for s in job.stages:
            detail = s["error"].strip().splitlines()[-1] if s["error"] else json.dumps(s["output"])
            stages.add_row(s["stage"], s["kind"], s["status"], str(s["attempt"]), detail)
        out.print(stages)


@app.command()
@friendly
def prune(
    older_than: Annotated[str, typer.Option(help="Age: 30s, 15m, 12h, 7d, 2w.")] = "7d",
) -> None:
    """Delete finished jobs older than a given age (with their stages and events).

    Example: worker prune --older-than 7d
    """
    removed = client().cleanup_jobs(older_than=older_than)
    out.print(f"removed {removed} finished jobs")


@app.command()
@friendly
def demo(
    jobs: Annotated[int, typer.Option(help="How many quick jobs to enqueue.")] = 40,
) -> None:
    """Run the demo on the embedded default: a batch of jobs, live progress, a summary.

    Example: worker demo --jobs 100
    """
    from worker.demo import run_demo

    run_demo(settings(), quick_jobs=jobs)


@app.command()
@friendly
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


@db_app.command("start")
@friendly
def db_start() -> None:
    """Start the embedded PostgreSQL (it is started on demand anyway) and print its URL."""
    out.print(url(), highlight=False)


@db_app.command("stop")
@friendly
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    from worker.db.engine import embedded_server

    embedded_server(settings()).stop()
    out.print("embedded PostgreSQL stopped")


def main() -> None:
    app()
