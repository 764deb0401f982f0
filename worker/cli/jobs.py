"""`worker enqueue`, `cancel`, `resume`, `retry`, `show` and `jobs`: one job, or many.

One job's verbs go through the client, which enforces which transitions a status allows;
listing and the bulk retry ask `worker.db.admin`. What this does not do: it runs no job.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from worker.cli.errors import fail
from worker.cli.lookup import resolve_job_id
from worker.cli.options import AsJson, JobId, Retryable, parse_age, parse_job_id, parse_json
from worker.cli.output import (
    Column,
    Fit,
    ago,
    emit_json,
    err,
    fitted,
    out,
    span,
    status_style,
    styled,
    summary,
)
from worker.cli.session import ask, client, settings
from worker.client.workflows import waiting_for
from worker.db import admin
from worker.models import JobStatus
from worker.progress_bar import progress_bar

BATCH = 1000  # rows per statement in bulk retry and prune: short locks, steady progress
MAX_PAGE = 10**12  # a page past it would skip more rows than a bigint OFFSET counts


def enqueue(
    task: Annotated[str, typer.Argument(help="The task name.")],
    payload: Annotated[str, typer.Option(help="The payload, a JSON object.")] = "{}",
    queue: Annotated[str, typer.Option()] = "default",
    priority: Annotated[int, typer.Option(help="Higher runs first (-100..100).")] = 0,
    delay: Annotated[float, typer.Option(help="Seconds before it may run.")] = 0.0,
    max_retries: Annotated[int | None, typer.Option()] = None,
    unique_key: Annotated[
        str | None, typer.Option(help="While a live job holds this key, print its id instead.")
    ] = None,
    concurrency_key: Annotated[
        str | None, typer.Option(help="Jobs sharing this key run one at a time, by default.")
    ] = None,
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
        unique_key=unique_key,
        concurrency_key=concurrency_key,
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


def cancel(job_id: JobId) -> None:
    """Cancel a job (cooperatively, if it is running). A job that has already ended is left as
    it is: an error naming its status (exit code 1), as for retrying or resuming a job in a
    status that does not allow it.

    Example: worker cancel 0b0e3c5e-...
    """
    job_id = resolve_job_id(job_id)
    # Read first: the cancel itself reports a job cancelled before as one it cancels now.
    before = ask(lambda conn: admin.job_status(conn, job_id))
    if before is None:
        raise fail(f"no job {job_id}")
    status = before if before.is_terminal else client().cancel(job_id)
    if before.is_terminal or (status.is_terminal and status != JobStatus.CANCELLED):
        raise fail(f"job {job_id} is already {status}: nothing to cancel")
    if status == JobStatus.CANCELLED:
        out.print(f"job {job_id} cancelled")
    else:
        out.print(f"job {job_id} is {status}: cancel requested, it stops at its next boundary")


def resume(
    job_id: JobId,
    answer: Annotated[str, typer.Option(help="The answer, as JSON.")] = "null",
) -> None:
    """Resume a paused job with an answer to its question.

    Example: worker resume 0b0e3c5e-... --answer '{"approved": true}'
    """
    answer_json = parse_json(answer, "--answer")
    job = client().resume(resolve_job_id(job_id), answer_json)
    out.print(f"job {job.job_id} resumed: {job.status}")


def retry(
    job_id: Annotated[
        str | None,
        typer.Argument(help="The job's id (a UUID); or use --all.", callback=parse_job_id),
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
    if job_id is not None:
        if all_jobs or task is not None or queue is not None:
            raise typer.BadParameter(
                "give either a job id or --all (with its filters), not both",
                param_hint="'JOB_ID' / '--all'",
            )
        job = client().retry(resolve_job_id(job_id))
        out.print(f"job {job.job_id} is {job.status} again")
        return
    if not all_jobs:
        raise typer.BadParameter(
            "give a job id, or --all (narrowed with --task, --queue, --status)",
            param_hint="'JOB_ID' / '--all'",
        )
    wanted = admin.RetrySet(JobStatus(status.value), task, queue)
    moved = ask(lambda conn: _retry_all(conn, wanted))
    if moved is None:
        out.print(f"no {status.value} jobs match: nothing to retry")
        return
    per_queue = ", ".join(f"{q}: {n}" for q, n in sorted(moved.items()))
    out.print(f"{sum(moved.values())} jobs back to pending ({per_queue})")


async def _retry_all(conn: admin.Conn, wanted: admin.RetrySet) -> dict[str, int] | None:
    """Retry the set batch by batch behind a progress bar: jobs moved per queue (None: none
    matched)."""
    retrying = await admin.count_retryable(conn, wanted)
    if not retrying.jobs:
        return None
    moved: dict[str, int] = {}
    with progress_bar(err) as bar:
        step = bar.add_task(f"retrying {wanted.status.value} jobs", total=retrying.jobs)
        while rows := await admin.retry_batch(conn, retrying, BATCH):
            for row in rows:
                moved[row.queue] = moved.get(row.queue, 0) + row.jobs
            bar.advance(step, sum(row.jobs for row in rows))
    return moved


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
    job_id = resolve_job_id(job_id)
    job = client().get(job_id)
    recent = ask(lambda conn: admin.last_events(conn, job_id, events))
    # The limit the claim applies (`sql.CLAIM`): the job's own, else its task's as its workers
    # published it (the CLI cannot import the task's code), else WORKER_MAX_RETRIES here.
    known = ask(lambda conn: admin.retry_limit(conn, job_id))
    limit = known if known is not None else settings().max_retries
    if as_json:
        data = {k: v for k, v in job.__dict__.items() if k != "client"}
        data["retry_limit"] = limit
        data["events"] = [asdict(e) for e in recent]
        emit_json(data)
        return
    table = Table(show_header=False, box=None)
    for name in ("job_id", "task", "queue"):
        table.add_row(name, str(getattr(job, name)))
    table.add_row("status", styled(job.status))
    table.add_row("priority", str(job.priority))
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
    if job.status is JobStatus.HELD:
        for parent in waiting_for(client(), job_id):
            name = parent.node or parent.task or "deleted"
            table.add_row("waiting for", f"{parent.job_id} {name} {styled(parent.status or '')}")
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
            message = Text(json.dumps(e.message) if e.message is not None else "")
            table.add_row(str(e.id), f"{e.created_at:%H:%M:%S}", e.step, e.status, message)
        out.print(table)


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
    page: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="Page number, from 1.")] = 1,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first, filtered by status, queue, task and age; one page at a time.

    Example: worker jobs --status failed --task send_email --newer-than 1h --limit 50
    """
    where = admin.JobFilter(
        status=status,
        queue=queue,
        task=task,
        older=parse_age(older_than, "--older-than") if older_than is not None else None,
        newer=parse_age(newer_than, "--newer-than") if newer_than is not None else None,
    )
    offset = (page - 1) * limit
    rows = ask(lambda conn: admin.find_jobs(conn, where, limit=limit, offset=offset))
    more, rows = len(rows) > limit, rows[:limit]
    if as_json:
        emit_json([{**asdict(row), "id": str(row.id)} for row in rows])
        return
    if not rows:
        out.print("no jobs match" + (f" on page {page}" if page > 1 else ""))
        return
    _print_jobs(rows)
    hint = f"; more with --page {page + 1}" if more else ""
    out.print(f"page {page}: {len(rows)} jobs, newest first{hint}", style="dim")


def _print_jobs(rows: list[admin.JobRow]) -> None:
    """One line per job: the error's first line gets the width the other columns leave; on a
    narrow terminal the ids shorten first, and the task and the status are never cut."""
    table, shortened = fitted(
        [
            Column("id", [str(row.id) for row in rows], Fit.TAIL, least=9),
            Column("task", [row.task for row in rows], Fit.WRAP, least=12),
            Column("queue", [row.queue for row in rows], Fit.CUT, least=8),
            Column(
                "status",
                [str(row.status) for row in rows],
                styles=[status_style(row.status) for row in rows],
            ),
            Column("retries", [str(row.retry_count) for row in rows]),
            Column("created", [ago(row.created_at) for row in rows]),
            Column(
                "error",
                [summary(row.error, 200) for row in rows],
                Fit.DROP,
                least=12,
                styles=["red"] * len(rows),
            ),
        ]
    )
    out.print(table)
    if shortened:
        out.print("ids shortened to their last characters: --json shows them whole", style="dim")
