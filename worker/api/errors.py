"""How the HTTP edge answers when something goes wrong: one JSON line, the right status.

Every error is `{"error": "..."}` (a 422 adds `detail`, one entry per bad field). A database
that cannot be reached is a 503 with `Retry-After`, a value it refuses a 422, a role that may
not act a 403, a missing schema a 503; anything else is a 500 whose traceback goes to the log,
never to the client. What this does not do: it decides no request; the handlers raise
`ApiError` or let the database's errors through to here.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.api.params import ApiError
from worker.api.schemas import ErrorOut
from worker.db.errors import CLASSIFIED, UNREACHABLE, Failure, failure
from worker.logs import first_line

log = logging.getLogger("worker.api")

# Errors that mean "the database is not reachable right now", not "this request is wrong": the
# edge does no other I/O, so an `OSError` is a socket to the database failing.
UNAVAILABLE = (*UNREACHABLE, OSError)


def json_response(model: BaseModel, status: int = 200) -> JSONResponse:
    """A success answer: the model as JSON."""
    return JSONResponse(model.model_dump(mode="json"), status_code=status)


def error_response(
    status: int,
    message: str,
    detail: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error answer: the one-line reason (and, for a 422, each bad field)."""
    body = ErrorOut(error=message, detail=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.detail, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _unavailable(request: Request, exc: Exception) -> Response:
    log.warning(
        "database unavailable for %s %s: %s", request.method, request.url.path, first_line(exc)
    )
    return error_response(
        503, f"database unavailable: {first_line(exc)}", headers={"Retry-After": "2"}
    )


async def _bad_data(request: Request, exc: Exception) -> Response:
    # A value the database (or its driver on the way there or back) refuses: NUL in text, a number
    # or a time out of its column's range. The statement failed, so nothing was written.
    log.info("%s %s refused by the database: %s", request.method, request.url.path, first_line(exc))
    return error_response(422, f"invalid value, refused by the database: {first_line(exc)}")


async def _not_permitted(request: Request, exc: Exception) -> Response:
    what = "change jobs" if request.method == "POST" else "read this"
    return error_response(
        403,
        f"the API's database role may not {what} ({first_line(exc)}); changing jobs needs "
        "the worker_runner role",
    )


async def _no_schema(request: Request, exc: Exception) -> Response:
    return error_response(503, "the worker schema is missing: run `worker migrate`")


async def _refused(request: Request, exc: Exception) -> Response:
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error (see the server log)")


# The answer to each kind of database failure.
_ANSWERS = {
    Failure.UNAVAILABLE: _unavailable,
    Failure.VALUE_REFUSED: _bad_data,
    Failure.NOT_PERMITTED: _not_permitted,
    Failure.NO_SCHEMA: _no_schema,
    Failure.STATEMENT_REFUSED: _refused,
}


async def _database_failure(request: Request, exc: Exception) -> Response:
    kind = failure(exc)
    assert kind is not None  # registered for the classified errors alone
    return await _ANSWERS[kind](request, exc)


def exception_handlers() -> dict[Any, Any]:
    """Starlette's `exception_handlers`: each error class to its answer."""
    return {
        ApiError: _api_error,
        HTTPException: _http_error,
        OSError: _unavailable,
        **dict.fromkeys(CLASSIFIED, _database_failure),
    }
