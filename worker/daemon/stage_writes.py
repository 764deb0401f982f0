"""Stage bookkeeping writes from all running jobs, committed together.

Every stage start and end is written (and committed) before the job goes on, so a stage's
output is never lost and a lost worker's cleanups are known. A commit waits for the WAL flush;
one per write made a 3-stage job cost seven flushes. A stage's end and the next stage's
start are one write (`sql.STAGE_ADVANCED`), so a 3-stage job makes four. Writes that arrive
while a flush is in progress go out together in the next transaction: one commit for what all
running jobs wrote meanwhile, in one round trip, and each job still waits for its own write to
be committed.

Up to `MAX_FLUSHES` such transactions are in flight at once, so a write seldom waits for a whole
commit it is not part of (the server flushes concurrent commits' WAL together). That cannot
reorder one job's writes: a job waits for each write before it makes the next.

    writes = StageWrites(pool)
    rows = await writes.run(sql.STAGE_STARTED, params)   # returns once committed
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.daemon.db import TRANSIENT

Rows = list[tuple[Any, ...]]

# Transactions in flight at once (each holds a pooled connection while it commits).
MAX_FLUSHES = 3


class StageWrites:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool
        self._pending: list[tuple[str, dict[str, Any], asyncio.Future[Rows]]] = []
        self._flushers: set[asyncio.Task[None]] = set()

    async def run(self, statement: str, params: dict[str, Any]) -> Rows:
        """Run `statement` in the next shared transaction; return its rows once committed."""
        future: asyncio.Future[Rows] = asyncio.get_running_loop().create_future()
        # A writer cancelled while waiting (shutdown) leaves nobody to read an error.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending.append((statement, params, future))
        if len(self._flushers) < MAX_FLUSHES:
            flusher = asyncio.create_task(self._flush(), name="stage-writes")
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await self._write([(s, p) for s, p, _ in batch])
            except TRANSIENT as exc:
                for *_, future in batch:  # each writer retries under its own patience
                    _settle(future, exc=exc)
                continue
            except psycopg.Error as exc:
                if len(batch) == 1:
                    _settle(batch[0][2], exc=exc)
                    continue
                # One write was refused: the others must not fail with it. Alone, each one
                # succeeds or fails on its own account.
                for statement, params, future in batch:
                    try:
                        _settle(future, rows=(await self._write([(statement, params)]))[0])
                    except (*TRANSIENT, psycopg.Error) as one:
                        _settle(future, exc=one)
                continue
            except BaseException as exc:
                for *_, future in batch:
                    _settle(future, exc=exc)
                raise
            for (*_, future), rows in zip(batch, results, strict=True):
                _settle(future, rows=rows)

    async def _write(self, batch: list[tuple[str, dict[str, Any]]]) -> list[Rows]:
        async with self._pool.connection() as conn:
            if len(batch) == 1:  # autocommit: the statement is its own transaction
                cur = await conn.execute(*batch[0])
                return [await cur.fetchall() if cur.description else []]
            # Several statements in one simple query run as one implicit transaction, in one
            # round trip (psycopg's pipeline mode does the same at several times the CPU cost).
            # The values are quoted client-side by psycopg, as literals of their types.
            client = psycopg.AsyncClientCursor(conn)
            await client.execute(";\n".join(client.mogrify(st, params) for st, params in batch))
            results: list[Rows] = []
            while True:
                results.append(await client.fetchall() if client.description else [])
                if not client.nextset():
                    return results


def _settle(
    future: asyncio.Future[Rows], rows: Rows | None = None, exc: BaseException | None = None
) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(rows or [])
