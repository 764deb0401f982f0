"""`worker stats` and `worker workers`: what the queues hold and who is working on them.

Both read live rows only (the `worker.queue_stats` view, the workers' registrations), so
they stay fast however many finished jobs the table holds. What this does not do: it changes
nothing; a late worker's jobs are rescued by the daemons, not here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from worker.cli.options import AsJson
from worker.cli.output import Column, Fit, emit_json, fitted, out, span
from worker.cli.session import ask, settings
from worker.db import admin


def stats(as_json: AsJson = False) -> None:
    """Per queue: pending, processing, paused, failed (1 h), oldest wait, throughput (1 min).

    Pending counts jobs due later too (`later` says how many); the oldest wait is how long the
    oldest due job has waited; throughput is jobs completed in the last minute. Reads the
    `worker.queue_stats` view (live jobs and the last hour only), so it stays fast however
    many finished jobs the table holds. Below the table, the pending jobs no live worker of
    their queue can run (`worker.unserved_tasks`), by task.

    Example: worker stats --json
    """
    if as_json:
        emit_json([asdict(row) for row in ask(admin.queue_stats)])
        return
    rows, unserved = ask(_stats_and_unserved)
    if not rows:
        out.print("no jobs pending, running or paused, and none finished in the last hour")
        return
    table, _ = fitted(
        [
            Column("queue", [row.queue for row in rows], Fit.WRAP, least=12),
            Column("pending", [str(row.pending) for row in rows]),
            Column("later", [str(row.scheduled) for row in rows]),
            Column("processing", [str(row.processing) for row in rows]),
            Column("paused", [str(row.paused) for row in rows]),
            Column(
                "failed 1h",
                [str(row.failed_last_hour) for row in rows],
                styles=["red" if row.failed_last_hour else "" for row in rows],
            ),
            Column(
                "oldest",
                [
                    span(row.oldest_pending_seconds) if row.pending > row.scheduled else "-"
                    for row in rows
                ],
            ),
            Column("done/min", [str(row.completed_last_minute) for row in rows]),
        ]
    )
    out.print(table)
    for row in unserved:
        who = (
            "no live worker runs the queue"
            if row.queue_workers == 0
            else f"none of its {row.queue_workers} live workers registered the task"
        )
        line = f"waiting: {row.jobs} of task {row.task!r} in queue {row.queue!r}: {who}"
        out.print(line, style="yellow", markup=False, highlight=False, soft_wrap=False)


async def _stats_and_unserved(
    conn: admin.Conn,
) -> tuple[list[admin.QueueRow], list[admin.UnservedTask]]:
    return await admin.queue_stats(conn), await admin.unserved_tasks(conn)


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
    alive = [row.heartbeat_age <= lease for row in rows]
    table, shortened = fitted(
        [
            Column("id", [str(row.id) for row in rows], Fit.TAIL, least=9),
            Column("host", [row.hostname for row in rows], Fit.CUT, least=10),
            Column("pid", [str(row.pid) for row in rows]),
            Column("queues", [",".join(row.queues) for row in rows], Fit.WRAP, least=10),
            Column("heartbeat", [f"{span(row.heartbeat_age)} ago" for row in rows]),
            Column(
                "state",
                ["alive" if ok else "late" for ok in alive],
                styles=["green" if ok else "red" for ok in alive],
            ),
            Column("jobs", [f"{len(row.jobs)}/{row.concurrency}" for row in rows]),
        ]
    )
    out.print(table)
    if shortened:
        out.print("ids shortened to their last characters: --json shows them whole", style="dim")


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
