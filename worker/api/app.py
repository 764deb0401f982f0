"""The HTTP edge as an ASGI app (Starlette): REST verbs, live job events, the dashboard.

    from worker.api import create_app
    app = create_app("postgresql://localhost/app", token="s3cret")   # any ASGI server runs it

Reads are open; every request that changes something (`POST`) needs
`Authorization: Bearer <token>` when a token is configured, and a JSON body (or none). Without a
token, a `POST` is accepted only when addressed to a loopback host and, if it carries an
`Origin`, from a page of that same host: a web page elsewhere cannot change jobs through the
browser of someone who runs the API locally. Errors are JSON (`{"error": "..."}`): 401/403
for a missing or wrong token, 403 for a cross-site request or a database role that may not
change jobs, 404 for an unknown job or workflow, 409 for an action the job's status does not
allow, 413 for a body over the limit, 415 for a body that is not JSON, 422 for a bad body or
parameter (naming it) or a value the database refuses, 503 while the database is unreachable.

Here are the routes and their handlers; what every handler shares (the checks of a `POST`,
the body read within bounds) is `worker.api.base`'s, the console's routes are
`worker.api.console`'s and the workflows' `worker.api.workflows`', a request's parameters
are read by `worker.api.params`, errors become answers in `worker.api.errors`, reads are
`worker.db.admin`'s operations and changes the client's. What this does not do: it runs no
job, and it keeps no state of its own between requests but the client and the event bus.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict
from importlib import resources
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from worker import __version__
from worker.api import console, workflows
from worker.api.base import ApiBase
from worker.api.errors import UNAVAILABLE, error_response, exception_handlers, json_response
from worker.api.openapi import build_spec
from worker.api.params import (
    DEFAULT_PAGE,
    MAX_EVENT_ID,
    MAX_PAGE,
    ApiError,
    body_as,
    decode_cursor,
    encode_cursor,
    int_param,
    invalid,
    path_job_id,
    text_param,
)
from worker.api.schemas import (
    ActionOut,
    EnqueueBody,
    Health,
    JobOut,
    JobPage,
    JobSummary,
    LimitBody,
    QueueList,
    QueueOut,
    QueueStats,
    ResumeBody,
    Stats,
)
from worker.api.stream import job_event_stream
from worker.client import InvalidJob, InvalidTransition, JobNotFound, QueueState
from worker.db import admin
from worker.events import PostgresBus, ProgressBus
from worker.logs import first_line
from worker.metrics import asgi_app
from worker.models import JobStatus
from worker.schema import STATUSES

# The page may use inline script and style, and nothing from anywhere else.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
)


@contextlib.contextmanager
def _about(job_id: str) -> Iterator[None]:
    """A client call on one job: an unknown job is a 404, a status that forbids it a 409."""
    try:
        yield
    except JobNotFound:
        raise ApiError(404, f"no job {job_id}") from None
    except InvalidTransition as exc:
        raise ApiError(409, str(exc)) from None


class _Api(ApiBase):
    """The request handlers of the REST routes."""

    async def status_of(self, job_id: str) -> JobStatus | None:
        async with self.session() as conn:
            return await admin.job_status(conn, job_id)

    async def job_out(self, job_id: str) -> JSONResponse:
        with _about(job_id):
            return json_response(JobOut.of(await self.client.get(job_id)))

    async def action(self, request: Request) -> str:
        """What a `POST` on one job without a body passes first; the job's id."""
        self.guard(request)
        await self.body(request)  # none is expected; still bounded, and JSON if any
        return path_job_id(request)

    # -- pages and probes -------------------------------------------------------------------

    async def dashboard(self, request: Request) -> Response:
        page = resources.files("worker.api").joinpath("dashboard.html").read_text("utf-8")
        return HTMLResponse(
            page, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"}
        )

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(build_spec(__version__))

    async def healthz(self, request: Request) -> Response:
        try:
            async with self.session() as conn:
                has_schema = await admin.health(conn)
        except UNAVAILABLE as exc:
            return error_response(503, f"database unavailable: {first_line(exc)}")
        if not has_schema:
            return error_response(503, "the worker schema is missing: run `worker migrate`")
        return json_response(Health(status="ok", database="ok"))

    async def stats(self, request: Request) -> Response:
        async with self.session() as conn:
            rows = await admin.job_stats(conn)
        queues: dict[str, QueueStats] = {}
        totals = dict.fromkeys(STATUSES, 0)
        for row in rows:
            entry = queues.setdefault(
                row.queue,
                QueueStats(
                    queue=row.queue,
                    counts=dict.fromkeys(STATUSES, 0),
                    oldest_pending_seconds=None,
                ),
            )
            entry.counts[row.status.value] = row.jobs
            totals[row.status.value] += row.jobs
            if row.oldest_pending is not None:
                entry.oldest_pending_seconds = float(row.oldest_pending)
        return json_response(Stats(queues=list(queues.values()), totals=totals))

    # -- jobs -------------------------------------------------------------------------------

    async def list_jobs(self, request: Request) -> Response:
        q = request.query_params
        unknown = set(q) - {"status", "queue", "task", "limit", "cursor"}
        if unknown:
            raise ApiError(422, f"unknown query parameter: {', '.join(sorted(unknown))}")
        status = q.get("status")
        if status is not None and status not in STATUSES:
            raise ApiError(422, f"invalid status: {status[:40]!r}; one of {', '.join(STATUSES)}")
        limit = int_param(q.get("limit"), "limit", 1, MAX_PAGE) or DEFAULT_PAGE
        before_at, before_id = (None, None)
        if "cursor" in q:
            before_at, before_id = decode_cursor(q["cursor"])
        where = admin.JobFilter(
            status=JobStatus(status) if status is not None else None,
            queue=text_param(q.get("queue"), "queue"),
            task=text_param(q.get("task"), "task"),
            before_at=before_at,
            before_id=before_id,
        )
        async with self.session() as conn:
            rows = await admin.find_jobs(conn, where, limit=limit)
        jobs = [JobSummary(**{**asdict(row), "id": str(row.id)}) for row in rows[:limit]]
        cursor = None
        if len(rows) > limit:
            cursor = encode_cursor(jobs[-1].created_at, jobs[-1].id)
        return json_response(JobPage(jobs=jobs, next_cursor=cursor))

    async def jobs(self, request: Request) -> Response:
        """`/jobs`: one route for both verbs, so a 405 (or `OPTIONS`) lists them both."""
        if request.method == "POST":
            return await self.enqueue(request)
        return await self.list_jobs(request)

    async def enqueue(self, request: Request) -> Response:
        self.guard(request)
        body = await self.object_body(request)
        if body is None:
            raise ApiError(422, "invalid body: expected a JSON object with at least a task")
        spec = body_as(EnqueueBody, body)
        try:
            job = await self.client.enqueue(
                spec.task,
                spec.payload,
                queue=spec.queue,
                priority=spec.priority,
                delay=spec.delay,
                run_at=spec.run_at,
                max_retries=spec.max_retries,
                unique_key=spec.unique_key,
                concurrency_key=spec.concurrency_key,
            )
        except InvalidJob as exc:
            raise ApiError(422, f"invalid job: {exc}") from None
        out = JobOut.of(await self.client.get(job.job_id))
        out.duplicate = job.duplicate
        return json_response(out, 200 if job.duplicate else 201)

    async def get_job(self, request: Request) -> Response:
        return await self.job_out(path_job_id(request))

    async def cancel(self, request: Request) -> Response:
        job_id = await self.action(request)
        with _about(job_id):
            status = await self.client.cancel(job_id)
        if status.is_terminal and status != JobStatus.CANCELLED:
            raise ApiError(409, f"job {job_id} already {status}: nothing to cancel")
        return json_response(
            ActionOut(id=job_id, status=status, cancel_requested=status != JobStatus.CANCELLED)
        )

    async def resume(self, request: Request) -> Response:
        self.guard(request)
        job_id = path_job_id(request)
        body = await self.object_body(request)
        try:
            answer = ResumeBody.model_validate(
                body if body is not None else {},
                context={"max_bytes": self.max_payload_bytes},
            ).answer
        except ValidationError as exc:
            raise invalid(exc, "body") from None
        try:
            with _about(job_id):
                job = await self.client.resume(job_id, answer)
        except InvalidJob as exc:
            raise ApiError(422, f"invalid body: {exc}") from None
        return json_response(JobOut.of(job))

    async def retry(self, request: Request) -> Response:
        job_id = await self.action(request)
        with _about(job_id):
            job = await self.client.retry(job_id)
        return json_response(JobOut.of(job))

    # -- queues -----------------------------------------------------------------------------

    async def list_queues(self, request: Request) -> Response:
        states = await self.client.queues()
        return json_response(QueueList(queues=[QueueOut(**asdict(s)) for s in states]))

    async def pause_queue(self, request: Request) -> Response:
        return await self._queue_change(request, lambda name, _: self.client.pause_queue(name))

    async def resume_queue(self, request: Request) -> Response:
        return await self._queue_change(request, lambda name, _: self.client.resume_queue(name))

    async def limit_queue(self, request: Request) -> Response:
        def limit(name: str, body: Any) -> Awaitable[QueueState]:
            limits = body_as(LimitBody, body or {})
            return self.client.limit_queue(
                name, concurrency=limits.concurrency, rate=limits.rate, burst=limits.burst
            )

        return await self._queue_change(request, limit)

    async def _queue_change(
        self, request: Request, change: Callable[[str, Any], Awaitable[QueueState]]
    ) -> Response:
        """A `POST /queues/{name}/...`: the queue's state after `change(name, body)`."""
        self.guard(request)
        body = await self.object_body(request)
        try:
            state = await change(request.path_params["name"], body)
        except InvalidJob as exc:
            raise ApiError(422, str(exc)) from None
        return json_response(QueueOut(**asdict(state)))

    async def events(self, request: Request) -> Response:
        job_id = path_job_id(request)
        # Both are checked when both are sent: a bad one is refused even where the other counts.
        header = int_param(request.headers.get("last-event-id"), "Last-Event-ID", 0, MAX_EVENT_ID)
        query = int_param(request.query_params.get("after"), "after", 0, MAX_EVENT_ID)
        after = header if header is not None else query
        if await self.status_of(job_id) is None:
            raise ApiError(404, f"no job {job_id}")
        return StreamingResponse(
            job_event_stream(self.bus, job_id, after or 0, self.status_of),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def create_app(url: str, token: str | None = None, *, bus: ProgressBus | None = None) -> Starlette:
    """The ASGI app for the database at `url` (a libpq URL).

    `token`: the bearer token every mutating request must carry (`WORKER_API_TOKEN`); None
    accepts them without one, so serve it only on a loopback address then (`check_bind`).
    `bus`: where job events are read; by default the PostgreSQL bus on the same database.

    >>> app = create_app("postgresql://localhost/app", token="s3cret")   # doctest: +SKIP
    >>> uvicorn.run(app, host="0.0.0.0", port=8000)                      # doctest: +SKIP
    """
    api = _Api(url, token, bus if bus is not None else PostgresBus(url))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await api.bus.start()
        try:
            yield
        finally:
            try:
                await api.bus.aclose()
            finally:
                # The client's direct connections (enqueues) as well as its engine's pool.
                await api.client.close()

    routes = [
        Route("/", api.dashboard, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/stats", api.stats, methods=["GET"]),
        # Read like the other GETs: open, whether or not the API has a token.
        Route("/metrics", asgi_app(url), methods=["GET"]),
        Route("/jobs", api.jobs, methods=["GET", "POST"]),
        Route("/jobs/{id}", api.get_job, methods=["GET"]),
        Route("/jobs/{id}/events", api.events, methods=["GET"]),
        Route("/jobs/{id}/cancel", api.cancel, methods=["POST"]),
        Route("/jobs/{id}/resume", api.resume, methods=["POST"]),
        Route("/jobs/{id}/retry", api.retry, methods=["POST"]),
        Route("/queues", api.list_queues, methods=["GET"]),
        Route("/queues/{name}/pause", api.pause_queue, methods=["POST"]),
        Route("/queues/{name}/resume", api.resume_queue, methods=["POST"]),
        Route("/queues/{name}/limit", api.limit_queue, methods=["POST"]),
        *console.routes(api),
        *workflows.routes(api),
    ]
    app = Starlette(routes=routes, exception_handlers=exception_handlers(), lifespan=lifespan)
    app.state.api = api
    return app
