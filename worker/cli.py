"""The `worker` program: the daemon, migrations, and the operator's verbs.

Errors are one red line and exit code 1 (bad settings and usage: 2), never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
import math
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from worker.models import JobStatus
from worker.settings import Settings, SettingsError, load_settings_or_exit

if TYPE_CHECKING:
    import psycopg
    from rich.progress import Progress

    from worker.metrics import MetricsServer

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
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
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
        except OverflowError as exc:  # a date or duration past what can be represented
            raise fail(f"out of range: {exc}") from None
        except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
            raise fail(f"cannot reach the database: {first_line(exc)}") from None
        except (psycopg.DataError, sqlalchemy.exc.DataError) as exc:
            raise fail(f"the database refused a value: {first_line(exc)}") from None
        except (psycopg.ProgrammingError, sqlalchemy.exc.ProgrammingError) as exc:
            cause = getattr(exc, "orig", None) or exc
            if isinstance(cause, psycopg.errors.InsufficientPrivilege):
                raise fail(f"the database role may not do this: {first_line(exc)}") from None
            if isinstance(cause, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
                raise fail("the worker schema is missing: run `worker migrate` first") from None
            raise

    return wrapper  # type: ignore[return-value]


def first_line(exc: BaseException) -> str:
    """The database's own words, without the statement SQLAlchemy appends or any password."""
    from worker.logs import scrub

    text = str(getattr(exc, "orig", None) or exc).strip()
    return scrub(text.splitlines()[0] if text else type(exc).__name__)


def settings() -> Settings:
    return load_settings_or_exit()


def url() -> str:
    from worker.db.url import database_url

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
    """Migrate when asked; otherwise insist the schema exists (the embedded default is
    migrated when it starts)."""

    from worker.db import migrate as migrations
    from worker.db.connect import connect

    if migrate:
        migrations.upgrade(database)
        return
    with connect(database, "durable-worker") as conn:
        found = conn.execute("SELECT to_regclass('worker.jobs')").fetchone()
    if not found or found[0] is None:
        raise CliError("the worker schema is missing: run `worker migrate` first")


# -- helpers for the operator's verbs ---------------------------------------------------------

_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
BATCH = 1000  # rows per statement in bulk retry and prune: short locks, steady progress
_STATUS_STYLE = {
    "pending": "yellow",
    "processing": "cyan",
    "completed": "green",
    "failed": "red",
    "paused": "magenta",
    "cancelled": "dim",
}


class Retryable(StrEnum):
    """The statuses `worker retry --all --status` accepts."""

    FAILED = "failed"
    CANCELLED = "cancelled"


def parse_age(text: str, option: str) -> float:
    """An age such as `30s`, `15m`, `12h`, `7d`, `2w` (or plain seconds) in seconds.

    >>> parse_age("15m", "--older-than")
    900.0
    """
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _AGE_UNITS else "s"
    number = value[:-1] if value[-1:] in _AGE_UNITS else value
    try:
        seconds = float(number) * _AGE_UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise typer.BadParameter(
            f"{text!r} is not an age like 30s, 15m, 12h, 7d or 2w", param_hint=option
        )
    return seconds


def _job_id(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a job id (a UUID such as 0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b)"
        ) from None


JobId = Annotated[str, typer.Argument(help="The job's id (a UUID).", callback=_job_id)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def connect() -> psycopg.Connection[dict[str, Any]]:
    """A connection whose rows are dicts (column name to value)."""
    from psycopg.rows import dict_row

    from worker.db.connect import connect as open_connection

    return open_connection(url(), "durable-worker-cli", row_factory=dict_row)


def emit_json(data: Any) -> None:
    def encode(value: Any) -> str:
        return value.isoformat() if isinstance(value, datetime) else str(value)

    out.print_json(json.dumps(data, default=encode))


def span(seconds: float | None) -> str:
    """A short human duration: 850ms, 4.2s, 3m 05s, 2h 10m, 3d 4h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return f"{span((datetime.now(UTC) - moment).total_seconds())} ago"


def styled(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, 'default')}]{status}[/]"


def summary(text: str | None, width: int = 60) -> str:
    """The first line of an error (`Type: message`; the traceback follows it), shortened."""
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def progress() -> Progress:
    """A progress bar on stderr, so stdout stays clean for scripts."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    )


# -- the daemon -------------------------------------------------------------------------------


@app.command()
@friendly
def run(
    modules: Annotated[list[str], typer.Argument(help="Modules defining your tasks.")],
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Jobs at once.")] = None,
    migrate: Annotated[bool, typer.Option(help="Apply migrations before starting.")] = False,
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            min=0,
            help="Give up (exit 1) if the database does not answer within this many seconds "
            "at start. Default: keep retrying until it answers.",
        ),
    ] = None,
) -> None:
    """Run the worker daemon until SIGTERM or Ctrl-C.

    Example: worker run myapp.tasks --queues default,emails --concurrency 20
    """
    from worker.daemon import DutyFailed, Worker
    from worker.daemon.db import DatabaseUnreachable, wait_for_database
    from worker.logs import configure

    s = settings()
    given = {"queues": queues, "concurrency": concurrency}
    for option, value in given.items():
        if value is not None:  # the settings' own checks: 1 to 1000 slots, a queue at least
            try:
                s = s.model_validate({**s.model_dump(), option: value})
            except ValidationError as exc:
                message = str(exc.errors()[0].get("msg", "is invalid"))
                raise fail(f"--{option}: {message.removeprefix('Value error, ')}", 2) from None
    configure(s.log_level, s.log_format)
    sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CliError(f"cannot import task module {name!r}: {exc}") from None
    database = url()
    try:
        wait_for_database(database, connect_timeout)
    except DatabaseUnreachable as exc:
        raise CliError(str(exc)) from None
    ensure_schema(database, migrate=migrate)
    worker = Worker(database, s)
    server = serve_metrics(worker, database, s) if s.metrics_port is not None else None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        await worker.run()

    try:
        asyncio.run(main())
    except DutyFailed as exc:  # logged with its traceback already
        raise CliError(str(exc)) from None
    finally:
        if server is not None:
            server.stop()
    if any(t.name.startswith("worker-task") and t.is_alive() for t in threading.enumerate()):
        # A sync task ignoring its timeout still runs; its job was handed back already.
        sys.stderr.flush()
        os._exit(0)


def serve_metrics(worker: Any, database: str, s: Settings) -> MetricsServer:
    """Count the worker's jobs and serve /metrics on WORKER_METRICS_PORT."""
    from worker import metrics
    from worker.logs import fields

    assert s.metrics_port is not None
    metrics.instrument(worker)
    try:
        server = metrics.serve(s.metrics_port, database, s.lease_seconds)
    except OSError as exc:
        raise CliError(
            f"cannot serve metrics on WORKER_METRICS_PORT={s.metrics_port}: {exc.strerror}"
        ) from None
    logging.getLogger("worker.daemon").info(
        "metrics at http://0.0.0.0:%d/metrics",
        server.port,
        extra=fields("metrics.serving", port=server.port),
    )
    return server


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
def cancel(job_id: JobId) -> None:
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
    job_id: JobId,
    answer: Annotated[str, typer.Option(help="The answer, as JSON.")] = "null",
) -> None:
    """Resume a paused job with an answer to its question.

    Example: worker resume 0b0e3c5e-... --answer '{"approved": true}'
    """
    job = client().resume(job_id, parse_json(answer, "--answer"))
    out.print(f"job {job.job_id} resumed: {job.status}")


@app.command()
@friendly
def retry(
    job_id: Annotated[
        str | None,
        typer.Argument(help="The job's id (a UUID); or use --all.", callback=_job_id),
    ] = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Retry every job matching --task, --queue, --status.")
    ] = False,
    task: Annotated[str | None, typer.Option(help="With --all: only this task.")] = None,
    queue: Annotated[str | None, typer.Option(help="With --all: only this queue.")] = None,
    status: Annotated[
        Retryable, typer.Option(help="With --all: which jobs.", case_sensitive=False)
    ] = Retryable.FAILED,
) -> None:
    """Run a failed or cancelled job again, with fresh retries; or many at once with --all.

    A bulk retry moves jobs in batches and shows a progress bar; jobs that fail again while
    it runs are not picked up twice.

    Example: worker retry --all --task send_email --status failed
    """
    from worker.db import sql

    if job_id is not None:
        if all_jobs or task is not None or queue is not None:
            raise typer.BadParameter(
                "give either a job id or --all (with its filters), not both",
                param_hint="'JOB_ID' / '--all'",
            )
        job = client().retry(job_id)
        out.print(f"job {job.job_id} is {job.status} again")
        return
    if not all_jobs:
        raise typer.BadParameter(
            "give a job id, or --all (narrowed with --task, --queue, --status)",
            param_hint="'JOB_ID' / '--all'",
        )
    params: dict[str, Any] = {"status": status.value, "task": task, "queue": queue}
    moved: dict[str, int] = {}
    with connect() as conn:
        found = conn.execute(sql.COUNT_RETRYABLE, params).fetchone()
        assert found is not None
        if not found["jobs"]:
            out.print(f"no {status.value} jobs match: nothing to retry")
            return
        params.update(cutoff=found["cutoff"], batch=BATCH)
        with progress() as bar:
            step = bar.add_task(f"retrying {status.value} jobs", total=found["jobs"])
            while rows := conn.execute(sql.RETRY_BATCH, params).fetchall():
                for row in rows:
                    moved[row["queue"]] = moved.get(row["queue"], 0) + row["moved"]
                bar.advance(step, sum(row["moved"] for row in rows))
    per_queue = ", ".join(f"{q}: {n}" for q, n in sorted(moved.items()))
    out.print(f"{sum(moved.values())} jobs back to pending ({per_queue})")


@app.command()
@friendly
def show(
    job_id: JobId,
    as_json: AsJson = False,
    events: Annotated[int, typer.Option(min=0, max=10_000, help="Newest events to show.")] = 20,
) -> None:
    """Show one job: payload, result, retries and last error, stages with outputs, events.

    A job keeps the error of its last attempt only; `retries` counts the attempts that failed
    before it.

    Example: worker show 0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b --json
    """
    from worker.db import sql

    job = client().get(job_id)
    with connect() as conn:
        recent = conn.execute(sql.LAST_EVENTS, {"job_id": job_id, "limit": events}).fetchall()
    recent.reverse()
    if as_json:
        data = {k: v for k, v in job.__dict__.items() if k != "client"}
        data["events"] = recent
        emit_json(data)
        return
    table = Table(show_header=False, box=None)
    for name in ("job_id", "task", "queue"):
        table.add_row(name, str(getattr(job, name)))
    table.add_row("status", styled(job.status))
    table.add_row("priority", str(job.priority))
    limit = job.max_retries if job.max_retries is not None else settings().max_retries
    table.add_row("retries", f"{job.retry_count} of {limit}")
    for name in ("created_at", "run_at", "started_at", "finished_at"):
        moment = getattr(job, name)
        table.add_row(name, f"{moment:%Y-%m-%d %H:%M:%S} ({ago(moment)})" if moment else "-")
    table.add_row("payload", json.dumps(job.payload))
    if job.result is not None:
        table.add_row("result", json.dumps(job.result))
    if job.question is not None:
        table.add_row("question", json.dumps(job.question))
    if job.error:
        table.add_row("last error", Text(job.error.strip(), style="red"))
    out.print(table)
    if job.stages:
        stages = Table(
            "stage", "kind", "status", "attempt", "took", "output / error", title="stages"
        )
        for s in job.stages:
            took = (
                span((s["finished_at"] - s["started_at"]).total_seconds())
                if s["finished_at"] and s["started_at"]
                else "-"
            )
            detail = (
                Text(summary(s["error"], 200), style="red")
                if s["error"]
                else Text(json.dumps(s["output"]))
            )
            stages.add_row(
                s["stage"], s["kind"], styled(s["status"]), str(s["attempt"]), took, detail
            )
        out.print(stages)
    if recent:
        table = Table("id", "at", "step", "status", "message", title="events")
        for e in recent:
            message = Text(json.dumps(e["message"]) if e["message"] is not None else "")
            table.add_row(
                str(e["id"]), f"{e['created_at']:%H:%M:%S}", e["step"], e["status"], message
            )
        out.print(table)


@app.command()
@friendly
def jobs(
    status: Annotated[
        JobStatus | None, typer.Option(help="Only jobs in this status.", case_sensitive=False)
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only jobs of this queue.")] = None,
    task: Annotated[str | None, typer.Option(help="Only jobs of this task.")] = None,
    older_than: Annotated[
        str | None, typer.Option(help="Created longer ago than this: 30s, 15m, 12h, 7d, 2w.")
    ] = None,
    newer_than: Annotated[
        str | None, typer.Option(help="Created within this: 30s, 15m, 12h, 7d, 2w.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs per page.")] = 20,
    page: Annotated[int, typer.Option(min=1, help="Page number, from 1.")] = 1,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first, filtered by status, queue, task and age; one page at a time.

    Example: worker jobs --status failed --task send_email --newer-than 1h --limit 50
    """
    from worker.db import sql

    params = {
        "status": status.value if status is not None else None,
        "queue": queue,
        "task": task,
        "older": parse_age(older_than, "--older-than") if older_than is not None else None,
        "newer": parse_age(newer_than, "--newer-than") if newer_than is not None else None,
        "before_at": None,
        "before_id": None,
        "limit": limit + 1,
        "offset": (page - 1) * limit,
    }
    with connect() as conn:
        rows = conn.execute(sql.FIND_JOBS, params).fetchall()
    more, rows = len(rows) > limit, rows[:limit]
    if as_json:
        emit_json([{**row, "id": str(row["id"])} for row in rows])
        return
    if not rows:
        out.print("no jobs match" + (f" on page {page}" if page > 1 else ""))
        return
    created = [ago(row["created_at"]) for row in rows]
    columns = {
        "id": [str(row["id"]) for row in rows],
        "task": [row["task"] for row in rows],
        "queue": [row["queue"] for row in rows],
        "status": [row["status"] for row in rows],
        "retries": [str(row["retry_count"]) for row in rows],
        "created": created,
    }
    # One line per job: the error's first line gets the width the other columns leave.
    widths = [max(len(name), *(len(c) for c in cells)) for name, cells in columns.items()]
    room = out.width - sum(widths) - 2 * len(widths)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in columns:
        table.add_column(name, no_wrap=True)
    if room >= 12:
        table.add_column("error", no_wrap=True)
    for i, row in enumerate(rows):
        cells: list[str | Text] = [columns[name][i] for name in columns]
        cells[3] = styled(row["status"])
        if room >= 12:
            cells.append(Text(summary(row["error"], room), style="red"))
        table.add_row(*cells)
    out.print(table)
    hint = f"; more with --page {page + 1}" if more else ""
    out.print(f"page {page}: {len(rows)} jobs, newest first{hint}", style="dim")


@app.command()
@friendly
def stats(as_json: AsJson = False) -> None:
    """Per queue: pending, processing, paused, failed (1 h), oldest wait, throughput (1 min).

    Pending counts jobs due later too ("of which later"); the oldest wait is how long the
    oldest due job has waited; throughput is jobs completed in the last minute. Reads the
    `worker.queue_stats` view (live jobs and the last hour only), so it stays fast however
    many finished jobs the table holds.

    Example: worker stats --json
    """
    from worker.db import sql

    with connect() as conn:
        rows = conn.execute(sql.QUEUE_STATS).fetchall()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no jobs pending, running or paused, and none finished in the last hour")
        return
    table = Table(
        "queue",
        "pending",
        "of which later",
        "processing",
        "paused",
        "failed (1h)",
        "oldest wait",
        "done/min",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for row in rows:
        table.add_row(
            row["queue"],
            str(row["pending"]),
            str(row["scheduled"]),
            str(row["processing"]),
            str(row["paused"]),
            f"[red]{row['failed_last_hour']}[/]" if row["failed_last_hour"] else "0",
            span(row["oldest_pending_seconds"]) if row["pending"] > row["scheduled"] else "-",
            str(row["completed_last_minute"]),
        )
    out.print(table)


@app.command()
@friendly
def workers(as_json: AsJson = False) -> None:
    """Registered workers: host, pid, queues, heartbeat age and the jobs each one holds.

    A worker whose heartbeat is older than WORKER_LEASE_SECONDS is `late`: it is presumed
    dead, and its jobs go back to pending at the next rescue.

    Example: worker workers --json
    """
    from worker.db import sql

    lease = settings().lease_seconds
    with connect() as conn:
        rows = conn.execute(sql.LIST_WORKERS).fetchall()
    data = [
        {
            "id": str(row["id"]),
            "hostname": row["hostname"],
            "pid": row["pid"],
            "queues": row["queues"],
            "concurrency": row["concurrency"],
            "started_at": row["started_at"],
            "heartbeat_at": row["heartbeat_at"],
            "heartbeat_age_seconds": row["heartbeat_age"],
            "alive": row["heartbeat_age"] <= lease,
            "jobs": row["jobs"],
        }
        for row in rows
    ]
    if as_json:
        emit_json(data)
        return
    if not data:
        out.print("no workers registered")
        return
    table = Table(
        "id",
        "host",
        "pid",
        "queues",
        "heartbeat",
        "state",
        "jobs",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    table.columns[0].no_wrap = True
    for w in data:
        table.add_row(
            w["id"],
            w["hostname"],
            str(w["pid"]),
            ",".join(w["queues"]),
            f"{span(w['heartbeat_age_seconds'])} ago",
            "[green]alive[/]" if w["alive"] else "[red]late[/]",
            f"{len(w['jobs'])}/{w['concurrency']}",
        )
    out.print(table)


@app.command()
@friendly
def prune(
    older_than: Annotated[str, typer.Option(help="Age: 30s, 15m, 12h, 7d, 2w.")] = "7d",
) -> None:
    """Delete finished jobs older than a given age (with their stages and events).

    Deletes in batches of 1000 with a progress bar, so workers are never held up for long.

    Example: worker prune --older-than 7d
    """
    from worker.db import sql
    from worker.models import TERMINAL_STATUSES

    seconds = parse_age(older_than, "--older-than")
    params: dict[str, Any] = {
        "statuses": sorted(s.value for s in TERMINAL_STATUSES),
        "before": datetime.now(UTC) - timedelta(seconds=seconds),
        "batch": BATCH,
    }
    removed = 0
    with connect() as conn:
        found = conn.execute(sql.COUNT_PRUNABLE, params).fetchone()
        total = int(found["count"]) if found else 0
        if total:
            with progress() as bar:
                step = bar.add_task("pruning finished jobs", total=total)
                while True:
                    n = conn.execute(sql.PRUNE_BATCH, params).rowcount
                    removed += n
                    bar.advance(step, n)
                    if n < BATCH:
                        break
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
    """Start the embedded PostgreSQL (it is started on demand anyway) and print its URL.

    Example: export DATABASE_URL=$(worker db start)
    """
    out.print(url(), highlight=False)


@db_app.command("stop")
@friendly
def db_stop() -> None:
    """Stop the embedded PostgreSQL.

    Example: worker db stop
    """
    from worker.db.url import embedded_server

    embedded_server(settings()).stop()
    out.print("embedded PostgreSQL stopped")


def main() -> None:
    """The `worker` program. Usage errors are one red line too, with exit code 2."""
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # Typer's usage errors (BadParameter, ...) derive it
        if type(exc).__name__ == "NoArgsIsHelpError":
            err.print(exc.format_message(), highlight=False, markup=False)  # `worker` alone
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = escape(exc.format_message().replace("\n", " "))
        err.print(f"[red]error:[/red] {message}{hint}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("[red]error:[/red] aborted", highlight=False)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
