"""`worker.api.lifespan`: the lifespans of mounted apps run with the outer app's, which
Starlette does not do by itself; the outer app's own lifespan and its state still work."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from worker.api import lifespan


def recording_app(name: str, log: list[str]) -> Starlette:
    @contextlib.asynccontextmanager
    async def life(app: Starlette) -> AsyncIterator[None]:
        log.append(f"{name} up")
        yield
        log.append(f"{name} down")

    return Starlette(lifespan=life)


def test_mounted_apps_start_in_order_before_the_outer_app_and_stop_in_reverse() -> None:
    log: list[str] = []
    first, second = recording_app("first", log), recording_app("second", log)

    @contextlib.asynccontextmanager
    async def outer_life(app: Any) -> AsyncIterator[dict[str, str]]:
        log.append("outer up")
        yield {"greeting": "hello"}
        log.append("outer down")

    async def state(request: Request) -> JSONResponse:
        return JSONResponse({"greeting": request.state.greeting})

    outer = Starlette(
        routes=[Route("/state", state), Mount("/a", first), Mount("/b", second)],
        lifespan=lifespan(first, second, then=outer_life),
    )
    with TestClient(outer) as http:
        assert log == ["first up", "second up", "outer up"]
        assert http.get("/state").json() == {"greeting": "hello"}  # the outer app's state
    assert log[3:] == ["outer down", "second down", "first down"]


def test_without_it_a_mounted_apps_lifespan_never_runs() -> None:
    log: list[str] = []
    inner = recording_app("inner", log)
    with TestClient(Starlette(routes=[Mount("/inner", inner)])):
        pass
    assert log == []
    with TestClient(Starlette(routes=[Mount("/inner", inner)], lifespan=lifespan(inner))):
        assert log == ["inner up"]
    assert log == ["inner up", "inner down"]
