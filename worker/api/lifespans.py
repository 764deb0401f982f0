"""`lifespan`: the lifespans of ASGI apps mounted inside another, run by the outer app's own.

Starlette (and so FastAPI) runs the lifespan of the app it serves, never those of the apps
mounted inside it: `worker.api`'s app, mounted in a FastAPI app, would never start its event
bus nor close its connections. Give the outer app `lifespan(inner, ...)` and each mounted app's
lifespan runs around the outer app's life, started in order and stopped in reverse.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette

# What Starlette's and FastAPI's `lifespan=` take: the app, to a context manager around its
# life, which may yield a state mapping for the requests.
Lifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]


def lifespan(*mounted: Starlette, then: Lifespan | None = None) -> Lifespan:
    """A lifespan for an app with `mounted` apps inside it: runs theirs, then `then` (the
    outer app's own, if it has one; what it yields is the requests' state).

    >>> jobs = create_app(url)                                          # doctest: +SKIP
    >>> app = FastAPI(lifespan=lifespan(jobs, then=app_lifespan))       # doctest: +SKIP
    >>> app.mount("/worker", jobs)                                      # doctest: +SKIP
    """

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[Mapping[str, Any] | None]:
        async with contextlib.AsyncExitStack() as stack:
            for inner in mounted:
                await stack.enter_async_context(inner.router.lifespan_context(inner))
            state = None if then is None else await stack.enter_async_context(then(app))
            yield state

    return run
