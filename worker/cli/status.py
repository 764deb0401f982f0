"""`worker stats` and `worker workers`: what the queues hold and who is working on them.

Both read live rows only (the `worker.queue_stats` view, the workers' registrations), so
they stay fast however many finished jobs the table holds. What this does not do: it changes
nothing; a late worker's jobs are rescued by the daemons, not here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from worker.cli.options import AsJson
from worker.cli.output import emit_json, out, span
from worker.cli.session import ask, settings
from worker.db import admin


def _table(*columns: str) -> Table:
    return Table(*columns, box=None, pad_edge=False, header_style="bold")


def stats(as_json: AsJson = False) -> None:
    """Per queue: pending, processing, paused, failed (1 h), oldest wait, throughput (1 min).

    Pending counts jobs due later too ("of which later"); the oldest wait is how long the
    oldest due job has waited; throughput is jobs completed in the last minute. Reads the
    `worker.queue_stats` view (live jobs and the last hour only), so it stays fast however
    many finished jobs the table holds.

    Example: worker stats --json
    """
    rows = ask(admin.queue_stats)
    if as_json:
        emit_json([asdict(row) for row in rows])
        return
    if not rows:
        out.print("no jobs pending, running or paused, and none finished in the last hour")
        return
    table = _table(
        "queue",
        "pending",
        "of which later",
        "processing",
        "paused",
        "failed (1h)",
        "oldest wait",
        "done/min",
    )
    for row in rows:
        table.add_row(
            row.queue,
            str(row.pending),
            str(row.scheduled),
            str(row.processing),
            str(row.paused),
            f"[red]{row.failed_last_hour}[/]" if row.failed_last_hour else "0",
            span(row.oldest_pending_seconds) if row.pending > row.scheduled else "-",
            str(row.completed_last_minute),
        )
    out.print(table)


def workers(as_json: AsJson = False) -> None:
    """Registered workers: host, pid, queues, heartbeat age and the jobs each one holds.

    A worker whose heartbeat is older than WORKER_LEASE_SECONDS is `late`: it is presumed
    dead, and its jobs go back to pending at the next rescue.

    Example: worker workers --json
    """
    lease = settings().lease_seconds
    rows = ask(admin.list_workers)
    if as_json:
        emit_json([_worker_json(row, lease) for row in rows])
        return
    if not rows:
        out.print("no workers registered")
        return
    table = _table("id", "host", "pid", "queues", "heartbeat", "state", "jobs")
    table.columns[0].no_wrap = True
    for row in rows:
        table.add_row(
            str(row.id),
            row.hostname,
            str(row.pid),
            ",".join(row.queues),
            f"{span(row.heartbeat_age)} ago",
            "[green]alive[/]" if row.heartbeat_age <= lease else "[red]late[/]",
            f"{len(row.jobs)}/{row.concurrency}",
        )
    out.print(table)


def _worker_json(row: admin.WorkerRow, lease: float) -> dict[str, Any]:
    """A worker as `worker workers --json` prints it: alive while its heartbeat is within the
    lease."""
    return {
        "id": str(row.id),
        "hostname": row.hostname,
        "pid": row.pid,
        "queues": row.queues,
        "concurrency": row.concurrency,
        "started_at": row.started_at,
        "heartbeat_at": row.heartbeat_at,
        "heartbeat_age_seconds": row.heartbeat_age,
        "alive": row.heartbeat_age <= lease,
        "jobs": row.jobs,
    }
