"""`worker failures`: why jobs failed lately, grouped by task, error type and message.

Failures whose first error lines differ only in their figures (durations, ids, quoted values,
hex) are one group: the `worker.job_failures` view masks them (migration 0013), and this
command counts its rows over a window, most frequent first. What this does not do: it reads
only the failed jobs still kept (retention deletes old ones), and it changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from worker.cli.options import AsJson, parse_age
from worker.cli.output import Column, Fit, ago, emit_json, fitted, out
from worker.cli.session import ask
from worker.db import admin


def failures(
    since: Annotated[
        str, typer.Option(help="How far back: 30s, 15m, 12h, 7d, 2w.", show_default=True)
    ] = "1h",
    task: Annotated[str | None, typer.Option(help="Only this task's failures.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Groups shown at most.")] = 50,
    as_json: AsJson = False,
) -> None:
    """Failed jobs grouped by task, error type and message (figures masked), most frequent first.

    Example: worker failures --since 24h --task send_invoice
    """
    seconds = parse_age(since, "--since")
    groups = ask(lambda conn: admin.failure_groups(conn, seconds, task, limit))
    if as_json:
        emit_json([asdict(group) for group in groups])
        return
    if not groups:
        out.print(f"no failures in the last {since}" + (f" for task {task}" if task else ""))
        return
    table, _ = fitted(
        [
            Column("count", [str(g.failures) for g in groups], styles=["red"] * len(groups)),
            Column("task", [g.task for g in groups], Fit.WRAP, least=10),
            Column("error type", [g.error_type or "-" for g in groups], Fit.WRAP, least=10),
            Column("last seen", [ago(g.last_seen) for g in groups]),
            Column("first seen", [ago(g.first_seen) for g in groups]),
            Column("example job", [str(g.example_job_id) for g in groups], Fit.TAIL, least=9),
            Column("message", [g.message for g in groups], Fit.WRAP, least=20),
        ]
    )
    out.print(table)
