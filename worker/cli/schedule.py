"""`worker schedule`: the periodic tasks of some task modules, when each runs next and last.

It imports the modules as `worker run` does and lists each schedule: its task, its cron
expression or interval, its time zone, the queue its jobs go to, its next run, and from
`worker.schedules` (when the database answers) the last tick it fired and how many jobs it
enqueued. What this does not
do: it enqueues nothing and changes no row; an old schedule's row is deleted with SQL (see
docs/scheduling.md, "Periodic jobs").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from worker.cli.options import AsJson
from worker.cli.output import emit_json, err, out
from worker.cli.run import import_task_modules
from worker.cli.session import ask
from worker.db import admin
from worker.db.admin import ScheduleRow
from worker.db.errors import DATABASE_ERRORS, describe
from worker.schedules import SCHEDULES, Schedule


def _rows(keys: list[str]) -> dict[str, ScheduleRow] | None:
    """The schedules' rows by key; None (and a line on stderr) if the database cannot say."""

    try:
        return {row.key: row for row in ask(lambda conn: admin.schedule_rows(conn, keys))}
    except DATABASE_ERRORS as exc:
        err.print(f"last runs unknown: {describe(exc)}", highlight=False, markup=False)
        return None


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(sep=" ", timespec="seconds")


def schedule(
    modules: Annotated[list[str], typer.Argument(help="Modules defining your tasks.")],
    as_json: AsJson = False,
) -> None:
    """List the periodic tasks of these modules: schedule, time zone, next and last run.

    Example: worker schedule myapp.tasks --json
    """
    import_task_modules(modules)
    schedules = sorted(SCHEDULES.values(), key=lambda s: s.task)
    if not schedules:
        out.print("no periodic tasks in these modules")
        return
    rows = _rows([s.key for s in schedules])
    now = datetime.now(UTC)
    entries = [_entry(s, now, rows) for s in schedules]
    if as_json:
        emit_json(entries)
        return
    table = Table(
        *("task", "schedule", "timezone", "queue", "next run", "last fired"),
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for entry in entries:
        last = entry["last_fired"]
        table.add_row(
            entry["task"],
            entry["schedule"],
            entry["timezone"],
            entry["queue"],
            _when(entry["next_run"]),
            "unknown" if rows is None else "never" if last is None else _when(last),
        )
    out.print(table)


def _entry(s: Schedule, now: datetime, rows: dict[str, ScheduleRow] | None) -> dict[str, Any]:
    row = None if rows is None else rows.get(s.key)
    return {
        "task": s.task,
        "key": s.key,
        "schedule": s.description,
        "timezone": s.timezone,
        "queue": s.queue,
        "next_run": s.next_after(now),
        "last_fired": row.last_tick if row is not None and row.fired else None,
        "fired": None if rows is None else row.fired if row is not None else 0,
    }
