"""`AsyncDatabase`: how the asyncio client reaches PostgreSQL, the one implementation.

Three ways, each for what it suits: the reads and operator writes on the pooled sessions of
a SQLAlchemy engine, in autocommit (each of our statements is atomic on its own); the
enqueues outside a caller's transaction on kept connections (`AsyncDirectWrites`, one round
trip); and the enqueues in a caller's transaction on the connection given (see
`worker.db.targets`). `Database` in `worker.db.client_sync` is generated from this file by
`scripts/unasync.py`: edit here, then run it. It does not build statements: the client passes
them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from worker.db.connect import async_engine
from worker.db.direct import Params
from worker.db.direct_async import AsyncDirectWrites
from worker.db.targets import (
    ASYNC_TAKES,
    AsyncConnection,
    AsyncSession,
    AsyncTarget,
    portable,
    rows,
)


class AsyncDatabase:
    """The client's statements on the database of `url`; thread-safe."""

    def __init__(self, url: str) -> None:
        # The engine of the reads and operator writes; borrowed by the HTTP edge's queries.
        self.engine = async_engine(url)
        # Each of our statements is atomic on its own: autocommit spares a BEGIN and a COMMIT
        # round trip per call.
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        # Enqueues outside a caller's transaction: one prepared statement, one round trip.
        self._direct = AsyncDirectWrites(url)

    async def close(self) -> None:
        """Close the idle connections (new ones are opened if used again)."""
        await self._direct.close()
        await self.engine.dispose()

    async def run(self, statement: str, params: dict[str, Any]) -> Any:
        """Run `statement` on its own: its rows if it returns some, else its row count."""
        async with self._autocommit.connect() as conn:
            result = await conn.exec_driver_sql(statement, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    async def read_job(
        self, job: str, stages: str, params: dict[str, Any]
    ) -> tuple[Any, list[Any]] | None:
        """A job's row (`job`) and its stages' rows (`stages`), read on one session; None if
        there is no such job."""
        async with self._autocommit.connect() as conn:
            result = await conn.exec_driver_sql(job, params)
            row = result.fetchone()
            if row is None:
                return None
            result = await conn.exec_driver_sql(stages, params)
            return row, list(result.fetchall())

    async def insert(
        self,
        statement: str,
        again: str,
        params: dict[str, Any],
        connection: AsyncTarget,
        returning: bool,
    ) -> list[Any]:
        """Write with `statement`: on a kept connection (sent as `again`, its idempotent twin,
        if the connection turns out dead), or in the caller's transaction on `connection`.
        Returns the rows if `returning`."""
        if connection is None:
            return await self._direct.run(statement, again, params)
        if isinstance(connection, AsyncSession | AsyncConnection):
            result = await connection.execute(portable(statement), params)
            return rows(result, returning)
        if isinstance(connection, psycopg.AsyncConnection):
            # Tuples whatever the caller's row factory; no commit: the caller's transaction
            # (or its autocommit) decides when the job exists.
            async with connection.cursor(row_factory=tuple_row) as cur:
                await cur.execute(statement, params)
                return await cur.fetchall() if returning else []
        raise TypeError(f"connection= takes a {ASYNC_TAKES}, not {type(connection).__name__}")

    async def copy(
        self,
        statement: str,
        chunks: Iterable[str],
        again: str,
        params: Params,
        meanwhile: Callable[[], object],
    ) -> None:
        """A COPY on a kept connection; see `AsyncDirectWrites.copy`."""
        await self._direct.copy(statement, chunks, again, params, meanwhile=meanwhile)
