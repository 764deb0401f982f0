"""`worker migrate`, `worker prune` and `worker db start|stop`: keeping the database.

What this does not do: the migrations themselves are `worker.db.migrate`'s, and the embedded
server's life is `worker.db.embedded`'s; this only asks them.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from worker.cli.jobs import BATCH
from worker.cli.options import parse_age
from worker.cli.output import err, out
from worker.cli.session import ask, settings, url
from worker.db import admin
from worker.progress_bar import progress_bar


def migrate(
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the SQL instead of running it.")
    ] = False,
) -> None:
    """Create or upgrade the `worker` schema (Alembic `upgrade head`): prints each migration it
    applies (id and title), or that the schema was already up to date, at which one.

    Example: worker migrate --sql > schema.sql
    """
    from worker.db import migrate as migrations

    if sql:
        out.print(migrations.upgrade_sql(), highlight=False, markup=False)
        return
    database = url()
    before = ask(admin.schema_revision, database)
    applied = migrations.revisions_after(before)
    migrations.upgrade(database)
    if not applied:
        out.print(f"[green]already up to date at {before}[/green]", highlight=False)
        return
    for revision, title in applied:
        out.print(f"applied {revision}: {title}", highlight=False, markup=False)
    out.print(f"[green]schema is up to date at {applied[-1][0]}[/green]", highlight=False)


def prune(
    older_than: Annotated[str, typer.Option(help="Age: 30s, 15m, 12h, 7d, 2w.")] = "7d",
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print what it would delete, per status; delete nothing."),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask first (on a terminal it asks).")
    ] = False,
) -> None:
    """Delete finished jobs older than a given age (with their stages and events).

    On a terminal it says how many it will delete, per status, and asks first (`--yes` does
    not ask); from a script or cron (stdin not a terminal) it deletes without asking.
    Deletes in batches of 1000 with a progress bar, so workers are never held up for long.

    Example: worker prune --older-than 7d --dry-run
    """
    seconds = parse_age(older_than, "--older-than")
    before = datetime.now(UTC) - timedelta(seconds=seconds)
    counts = ask(lambda conn: admin.count_prunable(conn, before))
    total = sum(counts.values())
    per_status = ", ".join(f"{status}: {n}" for status, n in counts.items())
    described = f"{total} finished jobs" + (f" ({per_status})" if total else "")
    if dry_run:
        out.print(f"would remove {described}; nothing removed (--dry-run)")
        return
    asking = total and not yes and sys.stdin.isatty()
    if asking and not typer.confirm(f"remove {described} older than {older_than}?", default=False):
        out.print("nothing removed")
        raise typer.Exit(1)
    removed = ask(lambda conn: _prune(conn, before, total)) if total else 0
    out.print(f"removed {removed} finished jobs")


async def _prune(conn: admin.Conn, before: datetime, total: int) -> int:
    """Delete batch by batch behind a progress bar; how many were deleted."""
    removed = 0
    with progress_bar(err) as bar:
        step = bar.add_task("pruning finished jobs", total=total)
        while True:
            n = await admin.prune_batch(conn, before, BATCH)
            removed += n
            bar.advance(step, n)
            if n < BATCH:
                break
    return removed


def db_start() -> None:
    """Start the embedded PostgreSQL (it is started on demand anyway) and print its URL.

    Example: export DATABASE_URL=$(worker db start)
    """
    out.print(url(), highlight=False)


def db_stop() -> None:
    """Stop the embedded PostgreSQL.

    Example: worker db stop
    """
    from worker.db.embedded import embedded_server

    embedded_server(settings()).stop()
    out.print("embedded PostgreSQL stopped")
