"""One-statement writes on kept psycopg connections: the client's enqueue path.

An enqueue is one autocommit statement, so it needs no transaction, no pool pre-ping and no
ORM: a kept connection and a prepared statement make it one round trip. A connection found
dead (a server restart, a dropped socket) is replaced and the statement sent once more on a
fresh connection, with the statement's idempotent twin (the client made the ids), so a write
whose commit was in doubt is never made twice. A batch of jobs may go by COPY instead: one
statement as well, sent again as its idempotent INSERT twin. A clash of prepared statements
(a transaction pooler the settings do not declare) is `PoolerMismatch`, saying so.

    writes = DirectWrites(url)
    rows = writes.run(sql.ENQUEUE, sql.ENQUEUE_AGAIN, params)

`AsyncDirectWrites` (in `worker.db.direct_async`) is the one implementation; `DirectWrites`
(in `worker.db.direct_sync`) is generated from it by `scripts/unasync.py`. This module holds
what both share: the connection options, the fork rule, and which event loop owns a kept
connection. It opens no connection itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

Rows = list[tuple[Any, ...]]
# The statement a write sends first, on a kept cursor.
First = Callable[[psycopg.Cursor[Any]], Rows]
AsyncFirst = Callable[[psycopg.AsyncCursor[Any]], Awaitable[Rows]]
# What `copy` sends again as its idempotent twin, made only if it must be.
Params = Callable[[], dict[str, Any]]
# The event loop a kept connection belongs to (None for a blocking one).
Owner = asyncio.AbstractEventLoop | None

# Idle connections kept per client; more run at once only while callers overlap.
MAX_IDLE = 5
APPLICATION_NAME = "durable-worker client"
# Prepared on first use: later calls skip parse and plan. Never behind a transaction pooler
# (`worker.db.connect` decides): there the next call may run on another server session.
PREPARE_THRESHOLD = 0

# Connections inherited through fork() are never used nor freed in the child: freeing one would
# end the parent's session on the shared socket.
inherited: list[Any] = []


def reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether `conn` may be kept for the next call: open, and in no transaction."""
    # The libpq status directly: `conn.info` builds an object per call, on every enqueue.
    return not conn.closed and conn.pgconn.transaction_status == TransactionStatus.IDLE


def loop_owner() -> Owner:
    """The owner of a connection opened now: the running event loop (a client may outlive
    an `asyncio.run`, and a connection is reused only on its own loop)."""
    return asyncio.get_running_loop()


def no_owner() -> Owner:
    """The owner of a blocking connection: none, any thread may reuse it."""
    return None
