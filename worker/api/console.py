"""The console's routes under `/console/`: the job list by tab and search, the job view's
holder and stage list, bulk retry and cancel over a filter, the workers, the charts.

    GET  /console/jobs?tab=failed&q=timeout&task=send_email&since=2026-12-02T12:00:00Z
    GET  /console/jobs/{id}            the worker holding it, its task's stages
    GET  /console/bulk?verb=retry&...  how many jobs a bulk verb would change
    POST /console/bulk                 {"verb": "retry", "filter": {...}, "expected": 12}
    GET  /console/workers              each worker, its heartbeat's age, the jobs it holds
    GET  /console/unserved             pending jobs no live worker of their queue can run
    GET  /console/charts?window=hour   outcomes per minute, each queue's depth

A bulk verb changes each job through the client's one-job verb, so the rules of a click on one
job (a running job is asked to stop; a job whose unique key is taken stays failed) apply to each.
It asks for the count the operator confirmed, and refuses when the filter now matches more.
What this does not do: the page itself is `dashboard.html` (one file, its script and style
inline); the charts read the rollup the
workers write (`worker.daemon.plugins.rollup`), never the jobs' history.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.errors import json_response
from worker.api.params import (
    DEFAULT_PAGE,
    MAX_PAGE,
    ApiError,
    body_as,
    decode_cursor,
    encode_cursor,
    int_param,
    path_job_id,
    text_param,
)
from worker.api.schemas import (
    BULK_MAX,
    BulkBody,
    BulkCount,
    BulkOut,
    ChartOut,
    ConsolePage,
    DepthPoint,
    HolderOut,
    JobViewOut,
    OutcomePoint,
    Since,
    UnservedList,
    UnservedTaskOut,
    Window,
    WorkerList,
)
from worker.client import InvalidTransition, JobNotFound
from worker.db import admin, console
from worker.db.console import BulkVerb, ConsoleFilter, Tab
from worker.db.sql import console as sql
from worker.models import JobStatus
from worker.settings import Settings, SettingsError, get_settings

if TYPE_CHECKING:
    from worker.api.base import ApiBase

_BULK_BATCH = 500
WINDOWS = {Window.HOUR: (timedelta(hours=1), 60), Window.DAY: (timedelta(days=1), 600)}
_FILTER_PARAMS = {"tab", "q", "queue", "task", "since"}
_SINCE: TypeAdapter[datetime] = TypeAdapter(Since)


def _choice(q: QueryParams, name: str, kind: type[StrEnum], default: str | None = None) -> Any:
    """The member of `kind` a parameter names; absent, `default` (an empty value is none)."""
    value = q.get(name, default)
    if value is None or value not in kind._value2member_map_:
        shown = "" if value is None else value[:40]
        raise ApiError(422, f"invalid {name}: {shown!r}; one of {', '.join(kind)}")
    return kind(value)


def _filter(q: QueryParams) -> ConsoleFilter:
    since = None
    if "since" in q:
        try:
            # Read as a body's `since` is, so both take what the spec's `date-time` says.
            since = _SINCE.validate_python(q["since"])
        except ValidationError:
            raise ApiError(
                422, "invalid since: an ISO 8601 time with a time zone, e.g. 2026-12-02T12:00Z"
            ) from None
    return ConsoleFilter(
        tab=_choice(q, "tab", Tab, Tab.ALL),
        q=text_param(q.get("q"), "q"),
        queue=text_param(q.get("queue"), "queue"),
        task=text_param(q.get("task"), "task"),
        since=since,
    )


def _known(q: QueryParams, allowed: set[str]) -> None:
    unknown = set(q) - allowed
    if unknown:
        raise ApiError(422, f"unknown query parameter: {', '.join(sorted(unknown))}")


class Console:
    """The console's handlers, over the API's client and pool."""

    def __init__(self, api: ApiBase) -> None:
        self.api = api
        self.lease_seconds = _lease()

    async def jobs(self, request: Request) -> Response:
        q = request.query_params
        _known(q, _FILTER_PARAMS | {"limit", "cursor"})
        where = _filter(q)
        limit = int_param(q.get("limit"), "limit", 1, MAX_PAGE) or DEFAULT_PAGE
        before_at, before_id = decode_cursor(q["cursor"]) if "cursor" in q else (None, None)
        async with self.api.session() as conn:
            rows = await console.list_jobs(
                conn, where, limit=limit, before_at=before_at, before_id=before_id
            )
            counts = await console.count_tabs(conn, where)
            now = await _now(conn)
        jobs = rows[:limit]
        cursor = None
        if len(rows) > limit:
            cursor = encode_cursor(jobs[-1].created_at, str(jobs[-1].id))
        return json_response(
            ConsolePage(
                jobs=jobs,
                next_cursor=cursor,
                counts={tab.value: n for tab, n in counts.items()},
                now=now,
            )
        )

    async def job(self, request: Request) -> Response:
        job_id = path_job_id(request)
        async with self.api.session() as conn:
            found = await console.job_context(conn, job_id)
            now = await _now(conn)
        if found is None:
            raise ApiError(404, f"no job {job_id}")
        holder = None
        if found.worker_id is not None:
            holder = HolderOut(
                id=str(found.worker_id),
                hostname=found.worker_host,
                pid=found.worker_pid,
                heartbeat_age=found.heartbeat_age,
            )
        return json_response(
            JobViewOut(
                worker=holder,
                stages=found.stages,
                cleanups=found.cleanups,
                retry_limit=found.retry_limit,
                now=now,
            )
        )

    async def bulk_route(self, request: Request) -> Response:
        """`/console/bulk`: one route for both methods, so a 405's `Allow` names both."""
        if request.method == "POST":
            return await self.bulk(request)
        return await self.bulk_count(request)

    async def bulk_count(self, request: Request) -> Response:
        q = request.query_params
        _known(q, _FILTER_PARAMS | {"verb"})
        verb: BulkVerb = _choice(q, "verb", BulkVerb)
        where = _filter(q)
        async with self.api.session() as conn:
            jobs = await console.count_bulk(conn, where, verb)
        return json_response(BulkCount(verb=verb, jobs=jobs))

    async def bulk(self, request: Request) -> Response:
        self.api.guard(request)
        raw = await self.api.object_body(request)
        if raw is None:
            raise ApiError(422, "invalid body: expected a JSON object with a verb and expected")
        body = body_as(BulkBody, raw)
        f = body.filter
        where = ConsoleFilter(tab=f.tab, q=f.q or None, queue=f.queue, task=f.task, since=f.since)
        async with self.api.session() as conn:
            matched = await console.count_bulk(conn, where, body.verb)
        if matched > body.expected:
            raise ApiError(
                409,
                f"the filter now matches {matched} jobs, more than the {body.expected} "
                "confirmed: look again and confirm the new count",
            )
        changed = unchanged = 0
        before: tuple[datetime, str] | None = None
        while changed + unchanged < min(body.expected, BULK_MAX):
            async with self.api.session() as conn:
                batch = await console.bulk_batch(
                    conn, where, body.verb, limit=_BULK_BATCH, before=before
                )
            if not batch:
                break
            for job_id, created_at in batch:
                if await self._one(body.verb, job_id):
                    changed += 1
                else:
                    unchanged += 1
                before = (created_at, job_id)
        async with self.api.session() as conn:
            left = await console.count_bulk(conn, where, body.verb)
        return json_response(
            BulkOut(verb=body.verb, changed=changed, unchanged=unchanged, more=left > 0)
        )

    async def _one(self, verb: BulkVerb, job_id: str) -> bool:
        """The one-job verb on `job_id`; False when the job's status no longer allows it."""
        client = self.api.client
        try:
            if verb is BulkVerb.RETRY:
                job = await client.retry(job_id)
                return job.status is not JobStatus.FAILED and job.status is not JobStatus.CANCELLED
            status = await client.cancel(job_id)
            return not status.is_terminal or status is JobStatus.CANCELLED
        except (JobNotFound, InvalidTransition):
            return False

    async def workers(self, request: Request) -> Response:
        async with self.api.session() as conn:
            rows = await console.workers(conn)
            now = await _now(conn)
        return json_response(WorkerList(workers=rows, lease_seconds=self.lease_seconds, now=now))

    async def unserved(self, request: Request) -> Response:
        async with self.api.session() as conn:
            rows = await admin.unserved_tasks(conn)
            now = await _now(conn)
        tasks = [UnservedTaskOut.model_validate(row, from_attributes=True) for row in rows]
        return json_response(UnservedList(tasks=tasks, now=now))

    async def charts(self, request: Request) -> Response:
        q = request.query_params
        _known(q, {"window", "queue", "task"})
        window: Window = _choice(q, "window", Window, Window.HOUR)
        span, bucket = WINDOWS[window]
        async with self.api.session() as conn:
            now = await _now(conn)
            end = _floor(now, bucket)
            start = end - span + timedelta(seconds=bucket)
            rows = await console.chart(
                conn,
                start,
                bucket,
                queue=text_param(q.get("queue"), "queue"),
                task=text_param(q.get("task"), "task"),
            )
        buckets = [
            start + timedelta(seconds=bucket * i)
            for i in range(int(span.total_seconds()) // bucket)
        ]
        outcomes = {b: [0, 0] for b in buckets}
        depth: dict[str, dict[datetime, tuple[int, int]]] = {}
        for row in rows:
            at = row.bucket.astimezone(UTC)
            if at in outcomes:
                outcomes[at][0] += row.completed
                outcomes[at][1] += row.failed
            depth.setdefault(row.queue, {})[at] = (row.pending, row.processing)
        return json_response(
            ChartOut(
                window=window,
                bucket_seconds=bucket,
                outcomes=[
                    OutcomePoint(bucket=b, completed=c, failed=f) for b, (c, f) in outcomes.items()
                ],
                depth={
                    queue: [
                        DepthPoint(
                            bucket=b,
                            pending=seen[b][0] if b in seen else None,
                            processing=seen[b][1] if b in seen else None,
                        )
                        for b in buckets
                    ]
                    for queue, seen in sorted(depth.items())
                },
            )
        )


def _floor(at: datetime, seconds: int) -> datetime:
    at = at.astimezone(UTC)
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


async def _now(conn: Any) -> datetime:
    """The database's clock: the page's relative times and the rollup's minutes agree with it."""
    row = await (await conn.execute(sql.NOW)).fetchone()
    assert row is not None
    at: datetime = row[0]
    return at.astimezone(UTC)


def _lease() -> float:
    """The lease the page compares heartbeats with (the API's settings, checked at start)."""
    try:
        return get_settings().lease_seconds
    except SettingsError:
        return Settings.model_fields["lease_seconds"].default  # type: ignore[no-any-return]


def routes(api: ApiBase) -> list[Route]:
    """The console's routes, for `create_app`."""
    c = Console(api)
    return [
        Route("/console/jobs", c.jobs, methods=["GET"]),
        Route("/console/jobs/{id}", c.job, methods=["GET"]),
        Route("/console/bulk", c.bulk_route, methods=["GET", "POST"]),
        Route("/console/workers", c.workers, methods=["GET"]),
        Route("/console/unserved", c.unserved, methods=["GET"]),
        Route("/console/charts", c.charts, methods=["GET"]),
    ]
