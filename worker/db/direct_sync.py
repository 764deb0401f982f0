# Generated from worker/db/direct_async.py by scripts/unasync.py: do not edit.
"""`DirectWrites`: the client's one-statement writes on kept connections, blocking.

Generated from `worker.db.direct_async`, the one implementation: see it (and
`worker.db.direct`) for what it does, and edit it (then run
`python scripts/unasync.py`), not this file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from worker.db.connect import MISPOOLED, POOLER_HINT, PoolerMismatch, connect
from worker.db.direct import (
    APPLICATION_NAME,
    MAX_IDLE,
    PREPARE_THRESHOLD,
    First,
    Owner,
    Params,
    Rows,
    inherited,
    no_owner,
    reusable,
)


class DirectWrites:
    """Writes of one statement each on kept connections; thread-safe. A connection is reused
    only by its owner (for a blocking one, any thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # A cursor kept with each connection: making one per call costs more than the call.
        # Beside each, its owner, in a list of its own: no pair is made per call.
        self._idle: list[psycopg.Cursor[Any]] = []
        self._owners: list[Owner] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, statement: str, again: str, params: dict[str, Any]) -> Rows:
        """Run `statement`; if the connection turns out dead, run `again` (its idempotent
        twin) once on a fresh connection. Returns the rows (empty if none are returned)."""
        return self._once(lambda cur: _execute(cur, statement, params), again, lambda: params)

    def copy(
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
        self._once(lambda cur: _copy(cur, statement, chunks, meanwhile), again, params)

    def _once(self, first: First, again: str, params: Params) -> Rows:
        cur = self._take()
        try:
            rows = first(cur)
        except MISPOOLED as exc:
            cur.connection.close()  # its prepared statements are not the server's
            raise PoolerMismatch(f"{exc}: {POOLER_HINT}") from None
        except psycopg.OperationalError:
            if not cur.connection.closed:
                self._give(cur)
                raise
            self.close()  # the outage that killed this one most likely killed them all
        except BaseException:
            self._give(cur)
            raise
        else:
            self._give(cur)
            return rows
        cur = self._open()
        try:
            return _execute(cur, again, params())
        finally:
            self._give(cur)

    def close(self) -> None:
        """Close the idle connections (those of another owner are just let go)."""
        with self._lock:
            idle, owners, self._idle, self._owners = self._idle, self._owners, [], []
        owner = no_owner()
        for cur, held_by in zip(idle, owners, strict=True):
            if held_by is owner:
                cur.connection.close()
            else:
                cur.connection.pgconn.finish()  # its loop is gone or elsewhere: no on it

    def _open(self) -> psycopg.Cursor[Any]:
        conn = connect(self.url, APPLICATION_NAME, prepare_threshold=PREPARE_THRESHOLD)
        return conn.cursor()

    def _take(self) -> psycopg.Cursor[Any]:
        owner = no_owner()
        found: psycopg.Cursor[Any] | None = None
        stale: list[psycopg.Cursor[Any]] | None = None
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
        return found if found is not None else self._open()

    def _give(self, cur: psycopg.Cursor[Any]) -> None:
        if reusable(cur.connection):
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < MAX_IDLE:
                    self._idle.append(cur)
                    self._owners.append(no_owner())
                    return
        cur.connection.close()


def _execute(cur: psycopg.Cursor[Any], statement: str, params: dict[str, Any]) -> Rows:
    cur.execute(statement, params)
    return cur.fetchall() if cur.rownumber is not None else []


def _copy(
    cur: psycopg.Cursor[Any],
    statement: str,
    chunks: Iterable[str],
    meanwhile: Callable[[], object],
) -> Rows:
    with cur.copy(statement) as copy:
        # Each chunk is sent as soon as it is made: the server writes the rows of one while
        # the next is made, and `meanwhile` runs before the wait for the last.
        for chunk in chunks:
            copy.write(chunk)
        meanwhile()
    return []
