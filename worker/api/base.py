"""What the API's handlers share: the client and the bus, the checks every `POST` passes
(same site or bearer token, a JSON content type), the body read within its bound, and a
connection of the client's pool for `worker.db.admin`'s reads.

The REST routes (`worker.api.app`) and the console's (`worker.api.console`) are handlers over
one `ApiBase`. What this does not do: route, or answer a request itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from worker.api.access import is_loopback
from worker.api.params import (
    BODY_SLACK_BYTES,
    PARSE_INLINE_BYTES,
    ApiError,
    is_json,
    parse_json,
    same_host,
)
from worker.client import AsyncClient
from worker.db import admin
from worker.events import ProgressBus

# What `ApiBase.body` returns for a request without one (a JSON `null` is a body).
_EMPTY: Any = object()


class ApiBase:
    """What every handler shares: one client, one bus, the checks and the reads below."""

    def __init__(self, url: str, token: str | None, bus: ProgressBus) -> None:
        self.client = AsyncClient(url)
        self.token = token or None
        self.bus = bus
        self.max_payload_bytes = self.client.max_payload_bytes
        self.max_body_bytes = 2 * self.max_payload_bytes + BODY_SLACK_BYTES

    def guard(self, request: Request) -> None:
        """What every `POST` must pass before its body is read."""
        if self.token is None:
            self.same_site(request)
        self.authorize(request)
        content_type = request.headers.get("content-type")
        if content_type is not None and not is_json(content_type):
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
        if origin is not None and not same_host(origin, host):
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
        """The request's JSON body (`_EMPTY` when there is none), refused with a 413 past the
        limit."""
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
            return _EMPTY
        if "content-type" not in request.headers:
            raise ApiError(415, "the body must be JSON, sent with Content-Type: application/json")
        if len(raw) > PARSE_INLINE_BYTES:
            return await asyncio.to_thread(parse_json, raw)
        return parse_json(raw)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[admin.Conn]:
        """A connection of the client's pool, for `worker.db.admin`'s reads: they share its
        bounds (size, timeouts, the check before reuse) rather than opening more."""
        async with admin.borrowed(self.client.engine) as conn:
            yield conn

    async def object_body(self, request: Request) -> dict[str, Any] | None:
        """A body that must be a JSON object when there is one (None: no body)."""
        raw = await self.body(request)
        if raw is _EMPTY:
            return None
        if not isinstance(raw, dict):
            raise ApiError(422, "invalid body: expected a JSON object")
        return raw
