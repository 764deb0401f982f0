"""What the HTTP edge reads from a request: parameters, cursors, job ids and JSON bodies.

Each parser refuses a bad value with an `ApiError` naming it (a 422, or a 404 for a path that
names no job), before anything reaches the database. What this does not do: it does not
check who may ask (that is `ApiBase.guard`), nor read a body off the wire (`ApiBase.body`).
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from worker.ids import job_id_text

MAX_PAGE = 500
DEFAULT_PAGE = 50
# A body holds one payload or answer (at most WORKER_MAX_PAYLOAD_BYTES encoded) plus a few
# fields; JSON may spell the same text up to twice as long (escapes), and then some.
BODY_SLACK_BYTES = 64 * 1024
# Bodies above this are parsed off the event loop, so other requests do not wait on them.
PARSE_INLINE_BYTES = 64 * 1024
# Event ids are bigint: a larger Last-Event-ID would make the stream's read fail every time.
MAX_EVENT_ID = 2**63 - 1
# A cursor is the last job's creation time (microseconds since 1970, 16 digits reach past the
# year 2200) and its id; every string of this form is a place in the list, so the spec can say
# exactly which cursors are accepted.
CURSOR_PATTERN = "^[0-9]{1,16}-[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DEFAULT_PORTS = {"http": 80, "https": 443}


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


def invalid(error: ValidationError, what: str) -> ApiError:
    """A 422 naming each field pydantic refused, the first in its one line."""
    detail = [
        {
            "loc": ".".join(str(part) for part in e["loc"]) or what,
            "msg": str(e["msg"]).removeprefix("Value error, "),
        }
        for e in error.errors()
    ]
    first = detail[0]
    return ApiError(422, f"invalid {what}: {first['loc']}: {first['msg']}", detail=detail)


M = TypeVar("M", bound=BaseModel)


def body_as(model: type[M], body: dict[str, Any]) -> M:
    """A JSON object body read as `model` (in JSON mode, so `3.0` is an integer and a string is
    not), or a 422 naming the field it refused."""
    try:
        return model.model_validate_json(json.dumps(body))
    except ValidationError as exc:
        raise invalid(exc, "body") from None
    except RecursionError:
        raise ApiError(422, "invalid body: nested too deeply") from None


def path_job_id(request: Request, what: str = "job") -> str:
    """The id of the request's path (a job's, or a `what`'s), in its canonical form."""
    raw = request.path_params["id"]
    canonical = job_id_text(raw)
    if canonical is None:
        # Not an id at all: as unknown as any other.
        raise ApiError(404, f"no {what} {raw}")
    return canonical


def encode_cursor(created_at: datetime, last_id: str) -> str:
    """The `next_cursor` after a page whose last job is (`created_at`, `last_id`); clients pass
    it back as it is, so the keyset it carries can change without breaking them.

    >>> encode_cursor(datetime(2026, 1, 1, tzinfo=UTC), "01a23781-9ff1-77ee-815f-2c84900f631d")
    '1767225600000000-01a237819ff177ee815f2c84900f631d'
    """
    micros = (created_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}-{last_id.replace('-', '')}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) keyset a cursor of `encode_cursor` carries."""
    if re.fullmatch(CURSOR_PATTERN, cursor) is None:
        raise ApiError(422, "invalid cursor: pass the next_cursor of a previous page")
    micros, raw_id = cursor.split("-")
    last_id = job_id_text(raw_id)
    assert last_id is not None  # 32 hex digits are always a UUID
    return _EPOCH + timedelta(microseconds=int(micros)), last_id


def int_param(value: str | None, name: str, low: int, high: int) -> int | None:
    """An integer parameter from `low` to `high`; None when absent (empty is no integer)."""
    if value is None:
        return None
    try:
        if re.fullmatch("[+-]?[0-9]+", value) is None:
            raise ValueError(value)  # int() would also take " 1_000 " and other scripts' digits
        number = int(value)
    except ValueError:
        raise ApiError(422, f"invalid {name}: {value[:40]!r} is not an integer") from None
    if not low <= number <= high:
        raise ApiError(422, f"invalid {name}: must be from {low} to {high}, not {number}")
    return number


def text_param(value: str | None, name: str) -> str | None:
    """A text parameter; None when absent or empty."""
    if not value:
        return None
    if "\x00" in value:
        # psycopg cannot send it, and PostgreSQL text could not hold it: no job has it.
        raise ApiError(422, f"invalid {name}: must not contain a NUL character (%00)")
    return value


def is_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON, whatever its parameters."""
    return content_type.partition(";")[0].strip().lower() == "application/json"


def _port(port: int | None, scheme: str) -> int | None:
    return port if port is not None else _DEFAULT_PORTS.get(scheme)


def same_host(origin: str, host: str) -> bool:
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


def parse_json(raw: bytes) -> Any:
    """A body as JSON that `jsonb` can store, or a 422 saying why not."""
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
