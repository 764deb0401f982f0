"""One-statement writes on kept psycopg connections: the client's enqueue path.

An enqueue is one autocommit statement, so it needs no transaction, no pool pre-ping and no
ORM: a kept connection and a prepared statement make it one round trip. A connection found
dead (a server restart, a dropped socket) is replaced and the statement sent once more on a
fresh connection, with the statement's idempotent twin (the client made the ids), so a write
whose commit was in doubt is never made twice. A batch of jobs may go by COPY instead: one
statement as well, sent again as its idempotent INSERT twin.

    writes = DirectWrites(url)
    rows = writes.run(sql.ENQUEUE, sql.ENQUEUE_AGAIN, params)
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from worker.db.connect import connect_options

Rows = list[tuple[Any, ...]]

# Idle connections kept per client; more run at once only while callers overlap.
MAX_IDLE = 5
APPLICATION_NAME = "durable-worker client"
_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": 0,  # prepared on first use: later calls skip parse and plan
    "fallback_application_name": APPLICATION_NAME,
}

# Connections inherited through fork() are never used nor freed in the child: freeing one would
# end the parent's session on the shared socket.
_inherited: list[Any] = []


def _reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # The libpq status directly: `conn.info` builds an object per call, on every enqueue.
    return not conn.closed and conn.pgconn.transaction_status == TransactionStatus.IDLE


class DirectWrites:
    """Blocking, thread-safe."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._options = {**connect_options(url, APPLICATION_NAME), **_OPTIONS}
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, statement: str, again: str, params: dict[str, Any]) -> Rows:
        """Run `statement`; if the connection turns out dead, run `again` (its idempotent
        twin) once on a fresh connection. Returns the rows (empty if none are returned)."""
        return self._once(lambda conn: _execute(conn, statement, params), again, lambda: params)

    def copy(
        self, statement: str, rows: str, again: str, params: Callable[[], dict[str, Any]]
    ) -> None:
        """Send `rows` (COPY text) by the COPY `statement`; if the connection turns out dead,
        run `again` with `params()` once on a fresh connection, as `run` does."""
        self._once(lambda conn: _copy(conn, statement, rows), again, params)

    def _once(
        self,
        first: Callable[[psycopg.Connection[Any]], Rows],
        again: str,
        params: Callable[[], dict[str, Any]],
    ) -> Rows:
        conn = self._take()
        try:
            rows = first(conn)
        except psycopg.OperationalError:
            if not conn.closed:
                self._give(conn)
                raise
            self._drop_idle()  # the outage that killed this one most likely killed them all
        except BaseException:
            self._give(conn)
            raise
        else:
            self._give(conn)
            return rows
        conn = psycopg.connect(self.url, **self._options)
        try:
            return _execute(conn, again, params())
        finally:
            self._give(conn)

    def close(self) -> None:
        self._drop_idle()

    def _take(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._pid != os.getpid():
                _inherited.extend(self._idle)
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return psycopg.connect(self.url, **self._options)

    def _give(self, conn: psycopg.Connection[Any]) -> None:
        if _reusable(conn):
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < MAX_IDLE:
                    self._idle.append(conn)
                    return
        conn.close()

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class AsyncDirectWrites:
    """The asyncio twin of `DirectWrites`. A connection is reused only on the event loop that
    opened it (a client may outlive an `asyncio.run`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._options = {**connect_options(url, APPLICATION_NAME), **_OPTIONS}
        # A cursor kept with each connection: making one per call costs more than the call.
        self._idle: list[tuple[psycopg.AsyncCursor[Any], asyncio.AbstractEventLoop]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    async def run(self, statement: str, again: str, params: dict[str, Any]) -> Rows:
        """See `DirectWrites.run`."""
        return await self._once(
            lambda cur: _execute_async(cur, statement, params), again, lambda: params
        )

    async def copy(
        self, statement: str, rows: str, again: str, params: Callable[[], dict[str, Any]]
    ) -> None:
        """See `DirectWrites.copy`."""
        await self._once(lambda cur: _copy_async(cur, statement, rows), again, params)

    async def _once(
        self,
        first: Callable[[psycopg.AsyncCursor[Any]], Awaitable[Rows]],
        again: str,
        params: Callable[[], dict[str, Any]],
    ) -> Rows:
        cur = await self._take()
        try:
            rows = await first(cur)
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
        cur = (await psycopg.AsyncConnection.connect(self.url, **self._options)).cursor()
        try:
            return await _execute_async(cur, again, params())
        finally:
            await self._give(cur)

    async def close(self) -> None:
        """Close the idle connections (those of other event loops are just let go)."""
        with self._lock:
            idle, self._idle = self._idle, []
        loop = asyncio.get_running_loop()
        for cur, owner in idle:
            if owner is loop:
                await cur.connection.close()
            else:
                cur.connection.pgconn.finish()  # its loop is gone or elsewhere: no await on it

    async def _take(self) -> psycopg.AsyncCursor[Any]:
        loop = asyncio.get_running_loop()
        stale = []
        found = None
        with self._lock:
            if self._pid != os.getpid():
                _inherited.extend(self._idle)
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                cur, owner = self._idle.pop()
                if owner is loop and not cur.connection.closed:
                    found = cur
                    break
                stale.append(cur)
        for cur in stale:
            cur.connection.pgconn.finish()
        if found is not None:
            return found
        return (await psycopg.AsyncConnection.connect(self.url, **self._options)).cursor()

    async def _give(self, cur: psycopg.AsyncCursor[Any]) -> None:
        if _reusable(cur.connection):
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < MAX_IDLE:
                    self._idle.append((cur, asyncio.get_running_loop()))
                    return
        await cur.connection.close()


def _execute(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any]) -> Rows:
    cur = conn.execute(statement, params)
    return cur.fetchall() if cur.rownumber is not None else []


async def _execute_async(
    cur: psycopg.AsyncCursor[Any], statement: str, params: dict[str, Any]
) -> Rows:
    await cur.execute(statement, params)
    return await cur.fetchall() if cur.rownumber is not None else []


def _copy(conn: psycopg.Connection[Any], statement: str, rows: str) -> Rows:
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(rows)
    return []


async def _copy_async(cur: psycopg.AsyncCursor[Any], statement: str, rows: str) -> Rows:
    async with cur.copy(statement) as copy:
        await copy.write(rows)
    return []
