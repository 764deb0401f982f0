"""The HTTP edge as an ASGI app (Starlette): REST verbs, live job events, the dashboard.

    from worker.api import create_app
    app = create_app("postgresql://localhost/app", token="s3cret")   # any ASGI server runs it

Reads are open; every request that changes something (`POST`) needs
`Authorization: Bearer <token>` when a token is configured, and a JSON body (or none). Without a
token, a `POST` is accepted only when addressed to a loopback host and, if it carries an
`Origin`, from a page of that same host: a web page elsewhere cannot change jobs through the
browser of someone who runs the API locally. Errors are JSON (`{"error": "..."}`): 401/403
for a missing or wrong token, 403 for a cross-site request or a database role that may not
change jobs, 404 for an unknown job, 409 for an action the job's status does not allow, 413 for
a body over the limit, 415 for a body that is not JSON, 422 for a bad body or parameter
(naming it) or a value the database refuses, 503 while the database is unreachable.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator
from datetime import datetime
from importlib import metadata, resources
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import psycopg
import psycopg.errors
import sqlalchemy.exc
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from worker.api.openapi import build_spec
from worker.api.schemas import (
    ActionOut,
    EnqueueBody,
    ErrorOut,
    Health,
    JobOut,
    JobPage,
    JobSummary,
    QueueStats,
    ResumeBody,
    Stats,
)
from worker.api.server import is_loopback
from worker.api.stream import job_event_stream
from worker.client import AsyncClient, InvalidJob, InvalidTransition, JobNotFound
from worker.db import sql
from worker.events import PostgresBus, ProgressBus
from worker.logs import scrub
from worker.metrics import asgi_app
from worker.models import JobStatus
from worker.schema import STATUSES

log = logging.getLogger("worker.api")

MAX_PAGE = 500
DEFAULT_PAGE = 50
# The page may use inline script and style, and nothing from anywhere else.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
)
# A body holds one payload or answer (at most WORKER_MAX_PAYLOAD_BYTES encoded) plus a few
# fields; JSON may spell the same text up to twice as long (escapes), and then some.
BODY_SLACK_BYTES = 64 * 1024
# Bodies above this are parsed off the event loop, so other requests do not wait on them.
PARSE_INLINE_BYTES = 64 * 1024
# Event ids are bigint: a larger Last-Event-ID would make the stream's read fail every time.
MAX_EVENT_ID = 2**63 - 1
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Errors that mean "the database is not reachable right now", not "this request is wrong".
UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    PoolTimeout,
    OSError,
)


class ApiError(Exception):
    """An answer other than success: status code and a one-line reason."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        detail: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail
        self.headers = headers


def _json(model: BaseModel, status: int = 200) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"), status_code=status)


def _error(
    status: int,
    message: str,
    detail: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorOut(error=message, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def _invalid(error: ValidationError, what: str) -> ApiError:
    detail = [
        {
            "loc": ".".join(str(part) for part in e["loc"]) or what,
            "msg": str(e["msg"]).removeprefix("Value error, "),
        }
        for e in error.errors()
    ]
    first = detail[0]
    return ApiError(422, f"invalid {what}: {first['loc']}: {first['msg']}", detail=detail)


def _job_id(request: Request) -> str:
    raw = request.path_params["id"]
    try:
        return str(UUID(raw))
    except ValueError:
        # Not a job id at all: as unknown as any other.
        raise ApiError(404, f"no job {raw}") from None


def _encode_cursor(created_at: datetime, job_id: str) -> str:
    text = f"{created_at.isoformat()}|{job_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, job_id = text.split("|", 1)
        return datetime.fromisoformat(at), str(UUID(job_id))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ApiError(422, "invalid cursor: pass the next_cursor of a previous page") from None


def _int_param(value: str | None, name: str, low: int, high: int) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise ApiError(422, f"invalid {name}: {value[:40]!r} is not an integer") from None
    if not low <= number <= high:
        raise ApiError(422, f"invalid {name}: must be from {low} to {high}, not {number}")
    return number


def _text_param(value: str | None, name: str) -> str | None:
    if not value:
        return None
    if "\x00" in value:
        # psycopg cannot send it, and PostgreSQL text could not hold it: no job has it.
        raise ApiError(422, f"invalid {name}: must not contain a NUL character (%00)")
    return value


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "application/json"


def _port(port: int | None, scheme: str) -> int | None:
    return port if port is not None else _DEFAULT_PORTS.get(scheme)


def _same_host(origin: str, host: str) -> bool:
    """Whether a browser's `Origin` names the host (and port) the request was sent to. Only
    the scheme's default port is assumed, so a TLS proxy in front (https outside, http here)
    still matches."""
    try:
        page = urlsplit(origin)
        target = urlsplit(f"//{host}")
        return (
            page.scheme in _DEFAULT_PORTS
            and page.hostname is not None
            and page.hostname == target.hostname
            and _port(page.port, page.scheme) == _port(target.port, page.scheme)
        )
    except ValueError:  # a port that is not a number, a malformed IPv6 literal
        return False


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]} is too large for a float")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(raw: bytes) -> Any:
    try:
        # NaN, Infinity and 1e400 are not JSON, and `jsonb` stores none of them.
        value = json.loads(raw, parse_float=_finite, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise ApiError(422, f"invalid body: not valid JSON ({reason})") from None
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                # Only a `\ud800`-style escape makes such text; it would not encode for the
                # database (nor for our own answer, if it were echoed).
                json.dumps({key: item}, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                name = key if key.isascii() else "a field name"
                raise ApiError(
                    422,
                    f"invalid body: {name}: contains half of a UTF-16 surrogate pair, "
                    "which cannot be stored",
                ) from None
            except (ValueError, RecursionError):
                pass  # the field's own check names it
    return value


class _Api:
    """The request handlers, sharing one client and one bus."""

    def __init__(self, url: str, token: str | None, bus: ProgressBus) -> None:
        self.client = AsyncClient(url)
        self.token = token or None
        self.bus = bus
        self.max_payload_bytes = self.client.max_payload_bytes
        self.max_body_bytes = 2 * self.max_payload_bytes + BODY_SLACK_BYTES

    # -- helpers ----------------------------------------------------------------------------

    def guard(self, request: Request) -> None:
        """What every `POST` must pass before its body is read."""
        if self.token is None:
            self.same_site(request)
        self.authorize(request)
        content_type = request.headers.get("content-type")
        if content_type is not None and not _is_json(content_type):
            raise ApiError(415, "the body must be JSON, sent with Content-Type: application/json")

    def same_site(self, request: Request) -> None:
        """Without a token, a browser is the way in: any page it shows can send a `POST`
        here (a form, or `fetch` without CORS), and a page on a name the attacker re-points at
        127.0.0.1 (DNS rebinding) even looks same-origin. So the request must be addressed to
        a loopback host, and come from a page of that host if it says where it came from."""
        host = request.headers.get("host", "")
        try:
            name = urlsplit(f"//{host}").hostname
        except ValueError:
            name = None
        if host and (name is None or not is_loopback(name)):
            raise ApiError(
                403,
                "this API has no token (WORKER_API_TOKEN), so it takes actions only addressed "
                "to a loopback host such as 127.0.0.1 or localhost",
            )
        origin = request.headers.get("origin")
        if origin is not None and not _same_host(origin, host):
            raise ApiError(403, "cross-site request refused: the Origin is not this API's host")

    def authorize(self, request: Request) -> None:
        if self.token is None:
            return  # no token: allowed only on a loopback address (see `check_bind`)
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401,
                "this action needs a bearer token: Authorization: Bearer $WORKER_API_TOKEN",
                headers={"WWW-Authenticate": 'Bearer realm="durable-worker"'},
            )
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise ApiError(403, "wrong bearer token")

    async def body(self, request: Request) -> Any:
        """The request's JSON body (None when empty), refused with a 413 past the limit."""
        too_large = ApiError(
            413,
            f"the body is larger than {self.max_body_bytes} bytes "
            f"(twice WORKER_MAX_PAYLOAD_BYTES, {self.max_payload_bytes}, and some)",
        )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large  # before a byte of it is read
        chunks: list[bytes] = []
        size = 0
        # Counted as it arrives as well: a chunked body declares no length.
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            return None
        if "content-type" not in request.headers:
            raise ApiError(415, "the body must be JSON, sent with Content-Type: application/json")
        if len(raw) > PARSE_INLINE_BYTES:
            return await asyncio.to_thread(_parse, raw)
        return _parse(raw)

    async def status_of(self, job_id: str) -> JobStatus | None:
        async with self.client.engine.connect() as conn:
            row = (await conn.exec_driver_sql(sql.JOB_STATUS, {"id": job_id})).fetchone()
        return None if row is None else JobStatus(row[0])

    async def job_out(self, job_id: str) -> JSONResponse:
        try:
            return _json(JobOut.of(await self.client.get(job_id)))
        except JobNotFound:
            raise ApiError(404, f"no job {job_id}") from None

    # -- pages and probes -------------------------------------------------------------------

    async def dashboard(self, request: Request) -> Response:
        page = resources.files("worker.api").joinpath("dashboard.html").read_text("utf-8")
        return HTMLResponse(
            page, headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"}
        )

    async def openapi(self, request: Request) -> Response:
        try:
            version = metadata.version("durable-worker")
        except metadata.PackageNotFoundError:
            version = "0"
        return JSONResponse(build_spec(version))

    async def healthz(self, request: Request) -> Response:
        try:
            async with self.client.engine.connect() as conn:
                (has_schema,) = (await conn.exec_driver_sql(sql.HEALTH)).one()
        except UNAVAILABLE as exc:
            return _error(503, f"database unavailable: {_first_line(exc)}")
        if not has_schema:
            return _error(503, "the worker schema is missing: run `worker migrate`")
        return _json(Health(status="ok", database="ok"))

    async def stats(self, request: Request) -> Response:
        async with self.client.engine.connect() as conn:
            rows: list[Any] = list((await conn.exec_driver_sql(sql.JOB_STATS)).fetchall())
        queues: dict[str, QueueStats] = {}
        totals = dict.fromkeys(STATUSES, 0)
        for queue, status, count, oldest in rows:
            entry = queues.setdefault(
                queue,
                QueueStats(
                    queue=queue, counts=dict.fromkeys(STATUSES, 0), oldest_pending_seconds=None
                ),
            )
            entry.counts[status] = int(count)
            totals[status] += int(count)
            if oldest is not None:
                entry.oldest_pending_seconds = float(oldest)
        return _json(Stats(queues=list(queues.values()), totals=totals))

    # -- jobs -------------------------------------------------------------------------------

    async def list_jobs(self, request: Request) -> Response:
        q = request.query_params
        unknown = set(q) - {"status", "queue", "task", "limit", "cursor"}
        if unknown:
            raise ApiError(422, f"unknown query parameter: {', '.join(sorted(unknown))}")
        status = q.get("status") or None
        if status is not None and status not in STATUSES:
            raise ApiError(422, f"invalid status: {status[:40]!r}; one of {', '.join(STATUSES)}")
        limit = _int_param(q.get("limit"), "limit", 1, MAX_PAGE) or DEFAULT_PAGE
        before_at, before_id = (None, None)
        if q.get("cursor"):
            before_at, before_id = _decode_cursor(q["cursor"])
        params = {
            "status": status,
            "queue": _text_param(q.get("queue"), "queue"),
            "task": _text_param(q.get("task"), "task"),
            "before_at": before_at,
            "before_id": before_id,
            "older": None,
            "newer": None,
            "limit": limit + 1,
            "offset": 0,
        }
        async with self.client.engine.connect() as conn:
            rows: list[Any] = list((await conn.exec_driver_sql(sql.FIND_JOBS, params)).fetchall())
        jobs = [
            JobSummary(
                id=str(r[0]),
                queue=r[1],
                task=r[2],
                status=r[3],
                priority=r[4],
                retry_count=r[5],
                error=r[6],
                created_at=r[7],
                run_at=r[8],
                started_at=r[9],
                finished_at=r[10],
            )
            for r in rows[:limit]
        ]
        cursor = None
        if len(rows) > limit:
            cursor = _encode_cursor(jobs[-1].created_at, jobs[-1].id)
        return _json(JobPage(jobs=jobs, next_cursor=cursor))

    async def enqueue(self, request: Request) -> Response:
        self.guard(request)
        body = await self.body(request)
        if not isinstance(body, dict):
            raise ApiError(422, "invalid body: expected a JSON object with at least a task")
        try:
            spec = EnqueueBody.model_validate_json(json.dumps(body))
        except ValidationError as exc:
            raise _invalid(exc, "body") from None
        except RecursionError:
            raise ApiError(422, "invalid body: payload: nested too deeply") from None
        try:
            job = await self.client.enqueue(
                spec.task,
                spec.payload,
                queue=spec.queue,
                priority=spec.priority,
                delay=spec.delay,
                run_at=spec.run_at,
                max_retries=spec.max_retries,
            )
        except InvalidJob as exc:
            raise ApiError(422, f"invalid job: {exc}") from None
        return _json(JobOut.of(await self.client.get(job.job_id)), 201)

    async def get_job(self, request: Request) -> Response:
        return await self.job_out(_job_id(request))

    async def cancel(self, request: Request) -> Response:
        self.guard(request)
        await self.body(request)  # none is expected; still bounded, and JSON if any
        job_id = _job_id(request)
        try:
            status = await self.client.cancel(job_id)
        except JobNotFound:
            raise ApiError(404, f"no job {job_id}") from None
        if status.is_terminal and status != JobStatus.CANCELLED:
            raise ApiError(409, f"job {job_id} already {status}: nothing to cancel")
        return _json(
            ActionOut(id=job_id, status=status, cancel_requested=status != JobStatus.CANCELLED)
        )

    async def resume(self, request: Request) -> Response:
        self.guard(request)
        job_id = _job_id(request)
        body = await self.body(request)
        try:
            answer = ResumeBody.model_validate(
                body if body is not None else {},
                context={"max_bytes": self.max_payload_bytes},
            ).answer
        except ValidationError as exc:
            raise _invalid(exc, "body") from None
        try:
            job = await self.client.resume(job_id, answer)
        except JobNotFound:
            raise ApiError(404, f"no job {job_id}") from None
        except InvalidTransition as exc:
            raise ApiError(409, str(exc)) from None
        except InvalidJob as exc:
            raise ApiError(422, f"invalid body: {exc}") from None
        return _json(JobOut.of(job))

    async def retry(self, request: Request) -> Response:
        self.guard(request)
        await self.body(request)  # none is expected; still bounded, and JSON if any
        job_id = _job_id(request)
        try:
            job = await self.client.retry(job_id)
        except JobNotFound:
            raise ApiError(404, f"no job {job_id}") from None
        except InvalidTransition as exc:
            raise ApiError(409, str(exc)) from None
        return _json(JobOut.of(job))

    async def events(self, request: Request) -> Response:
        job_id = _job_id(request)
        after = _int_param(request.headers.get("last-event-id"), "Last-Event-ID", 0, MAX_EVENT_ID)
        if after is None:
            after = _int_param(request.query_params.get("after"), "after", 0, MAX_EVENT_ID)
        if await self.status_of(job_id) is None:
            raise ApiError(404, f"no job {job_id}")
        return StreamingResponse(
            job_event_stream(self.bus, job_id, after or 0, self.status_of),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return scrub(text.splitlines()[0]) if text else type(exc).__name__


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error(exc.status, exc.message, exc.detail, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return _error(exc.status_code, str(exc.detail), headers=headers)


async def _unavailable(request: Request, exc: Exception) -> Response:
    log.warning(
        "database unavailable for %s %s: %s", request.method, request.url.path, _first_line(exc)
    )
    return _error(503, f"database unavailable: {_first_line(exc)}", headers={"Retry-After": "2"})


async def _bad_data(request: Request, exc: Exception) -> Response:
    # A value the database (or psycopg on its way there or back) refuses: NUL in text, a number
    # or a time out of its column's range. The statement failed, so nothing was written.
    log.info(
        "%s %s refused by the database: %s", request.method, request.url.path, _first_line(exc)
    )
    return _error(422, f"invalid value, refused by the database: {_first_line(exc)}")


async def _not_permitted(request: Request, exc: Exception) -> Response:
    what = "change jobs" if request.method == "POST" else "read this"
    return _error(
        403,
        f"the API's database role may not {what} ({_first_line(exc)}); changing jobs needs "
        "the worker_runner role",
    )


async def _programming(request: Request, exc: Exception) -> Response:
    if isinstance(getattr(exc, "orig", None), psycopg.errors.InsufficientPrivilege):
        return await _not_permitted(request, exc)
    if "does not exist" in str(exc):
        return _error(503, "the worker schema is missing: run `worker migrate`")
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error (see the server log)")


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
        Route("/jobs", api.list_jobs, methods=["GET"]),
        Route("/jobs", api.enqueue, methods=["POST"]),
        Route("/jobs/{id}", api.get_job, methods=["GET"]),
        Route("/jobs/{id}/events", api.events, methods=["GET"]),
        Route("/jobs/{id}/cancel", api.cancel, methods=["POST"]),
        Route("/jobs/{id}/resume", api.resume, methods=["POST"]),
        Route("/jobs/{id}/retry", api.retry, methods=["POST"]),
    ]
    handlers: dict[Any, Any] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        sqlalchemy.exc.ProgrammingError: _programming,
        psycopg.ProgrammingError: _programming,
        psycopg.errors.InsufficientPrivilege: _not_permitted,
        sqlalchemy.exc.DataError: _bad_data,
        psycopg.DataError: _bad_data,
        **dict.fromkeys(UNAVAILABLE, _unavailable),
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.api = api
    return app
