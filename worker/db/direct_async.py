"""`AsyncDirectWrites`: the client's one-statement writes on kept connections, for asyncio.

The one implementation of the kept-connection enqueue path (see `worker.db.direct` for the
rules it keeps); `DirectWrites` in `worker.db.direct_sync` is generated from this file by
`scripts/unasync.py`: edit here, then run it. It does not build statements: the client
passes them in.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from worker.db.connect import MISPOOLED, POOLER_HINT, PoolerMismatch, aconnect
from worker.db.direct import (
    APPLICATION_NAME,
    MAX_IDLE,
    PREPARE_THRESHOLD,
    AsyncFirst,
    Owner,
    Params,
    Rows,
    inherited,
    loop_owner,
    reusable,
)


class AsyncDirectWrites:
    """Writes of one statement each on kept connections; thread-safe. A connection is reused
    only by its owner (for asyncio, the event loop that opened it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # A cursor kept with each connection: making one per call costs more than the call.
        # Beside each, its owner, in a list of its own: no pair is made per call.
        self._idle: list[psycopg.AsyncCursor[Any]] = []
        self._owners: list[Owner] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    async def run(self, statement: str, again: str, params: dict[str, Any]) -> Rows:
        """Run `statement`; if the connection turns out dead, run `again` (its idempotent
        twin) once on a fresh connection. Returns the rows (empty if none are returned)."""
        return await self._once(lambda cur: _execute(cur, statement, params), again, lambda: params)

    async def copy(
        self,
        statement: str,
        chunks: Iterable[str],
        again: str,
        params: Params,
        meanwhile: Callable[[], object],
    ) -> None:
        """Send `chunks` (COPY text) by the COPY `statement`, and call `meanwhile()` once the
        last is sent, while the server is still writing them; if the connection turns out
        dead, run `again` with `params()` once on a fresh connection, as `run` does (then
        `meanwhile` may not have been called)."""
        await self._once(lambda cur: _copy(cur, statement, chunks, meanwhile), again, params)

    async def _once(self, first: AsyncFirst, again: str, params: Params) -> Rows:
        cur = await self._take()
        try:
            rows = await first(cur)
        except MISPOOLED as exc:
            await cur.connection.close()  # its prepared statements are not the server's
            raise PoolerMismatch(f"{exc}: {POOLER_HINT}") from None
        except psycopg.OperationalError:
            if not cur.connection.closed:
                await self._give(cur)
                raise
            await self.close()  # the outage that killed this one most likely killed them all
        except BaseException:
            await self._give(cur)
            raise
        else:
            await self._give(cur)
            return rows
        cur = await self._open()
        try:
            return await _execute(cur, again, params())
        finally:
            await self._give(cur)

    async def close(self) -> None:
        """Close the idle connections (those of another owner are just let go)."""
        with self._lock:
            idle, owners, self._idle, self._owners = self._idle, self._owners, [], []
        owner = loop_owner()
        for cur, held_by in zip(idle, owners, strict=True):
            if held_by is owner:
                await cur.connection.close()
            else:
                cur.connection.pgconn.finish()  # its loop is gone or elsewhere: no await on it

    async def _open(self) -> psycopg.AsyncCursor[Any]:
        conn = await aconnect(self.url, APPLICATION_NAME, prepare_threshold=PREPARE_THRESHOLD)
        return conn.cursor()

    async def _take(self) -> psycopg.AsyncCursor[Any]:
        owner = loop_owner()
        found: psycopg.AsyncCursor[Any] | None = None
        stale: list[psycopg.AsyncCursor[Any]] | None = None
        with self._lock:
            if self._pid != os.getpid():
                inherited.extend(self._idle)
                self._idle, self._owners, self._pid = [], [], os.getpid()
            while self._idle:
                cur = self._idle.pop()
                if self._owners.pop() is owner and not cur.connection.closed:
                    found = cur
                    break
                stale = stale or []
                stale.append(cur)
        if stale:  # closed, or another loop's: let go without awaiting anything on them
            for cur in stale:
                cur.connection.pgconn.finish()
        return found if found is not None else await self._open()

    async def _give(self, cur: psycopg.AsyncCursor[Any]) -> None:
        if reusable(cur.connection):
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < MAX_IDLE:
                    self._idle.append(cur)
                    self._owners.append(loop_owner())
                    return
        await cur.connection.close()


async def _execute(cur: psycopg.AsyncCursor[Any], statement: str, params: dict[str, Any]) -> Rows:
    await cur.execute(statement, params)
    return await cur.fetchall() if cur.rownumber is not None else []


async def _copy(
    cur: psycopg.AsyncCursor[Any],
    statement: str,
    chunks: Iterable[str],
    meanwhile: Callable[[], object],
) -> Rows:
    async with cur.copy(statement) as copy:
        # Each chunk is sent as soon as it is made: the server writes the rows of one while
        # the next is made, and `meanwhile` runs before the wait for the last.
        for chunk in chunks:
            await copy.write(chunk)
        meanwhile()
    return []
