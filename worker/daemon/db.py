"""The daemon's connections: one pool, and patience when the database goes away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

log = logging.getLogger("worker.daemon")
T = TypeVar("T")

# Errors that mean "the database is not reachable right now", as opposed to a bad statement.
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)


def make_pool(url: str, concurrency: int) -> AsyncConnectionPool:  # type: ignore[type-arg]
    # The claim loop, the completer and the maintenance duties need one connection each; stage
    # bookkeeping needs a few more at most. Capped, so 100 workers do not exhaust the server.
    size = min(3 + max(1, concurrency // 2), 16)
    return AsyncConnectionPool(
        url,
        min_size=2,
        max_size=size,
        kwargs={"autocommit": True},
        open=False,
        timeout=10.0,
        reconnect_timeout=float("inf"),
        name="worker",
    )


class Patience:
    """Retries an operation while the database is unreachable, with capped exponential backoff.

    Logs one line when the database goes away and one when it is back, not one per try.
    """

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self._stopping = stopping
        self.down_since: float | None = None

    async def run(self, what: str, op: Callable[[], Awaitable[T]], *, forever: bool = True) -> T:
        delay = 0.1
        while True:
            try:
                result = await op()
            except TRANSIENT as exc:
                loop = asyncio.get_running_loop()
                if self.down_since is None:
                    self.down_since = loop.time()
                    log.warning(
                        "database unreachable (%s while %s); retrying with backoff",
                        type(exc).__name__,
                        what,
                    )
                if not forever or self._stopping():
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if self.down_since is not None:
                loop = asyncio.get_running_loop()
                log.warning("database reachable again after %.1f s", loop.time() - self.down_since)
                self.down_since = None
            return result


async def fetch(
    pool: AsyncConnectionPool,  # type: ignore[type-arg]
    query: str,
    params: dict[str, Any],
) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []
