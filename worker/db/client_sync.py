# Generated from worker/db/client_async.py by scripts/unasync.py: do not edit.
"""`Database`: how the blocking client reaches PostgreSQL.

Generated from `worker.db.client_async`, the one implementation: see it for what it
does, and edit it (then run `python scripts/unasync.py`), not this file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from worker.db.connect import sync_engine
from worker.db.direct import Params
from worker.db.direct_sync import DirectWrites
from worker.db.targets import (
    SYNC_TAKES,
    Connection,
    Session,
    SyncTarget,
    portable,
    rows,
)


class Database:
    """The client's statements on the database of `url`; thread-safe."""

    def __init__(self, url: str) -> None:
        # The engine of the reads and operator writes; borrowed by the HTTP edge's queries.
        self.engine = sync_engine(url)
        # Each of our statements is atomic on its own: autocommit spares a BEGIN and a COMMIT
        # round trip per call.
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        # Enqueues outside a caller's transaction: one prepared statement, one round trip.
        self._direct = DirectWrites(url)

    def close(self) -> None:
        """Close the idle connections (new ones are opened if used again)."""
        self._direct.close()
        self.engine.dispose()

    def run(self, statement: str, params: dict[str, Any]) -> Any:
        """Run `statement` on its own: its rows if it returns some, else its row count."""
        with self._autocommit.connect() as conn:
            result = conn.exec_driver_sql(statement, params)
            return result.fetchall() if result.returns_rows else result.rowcount

    def read_job(
        self, job: str, stages: str, params: dict[str, Any]
    ) -> tuple[Any, list[Any]] | None:
        """A job's row (`job`) and its stages' rows (`stages`), read on one session; None if
        there is no such job."""
        with self._autocommit.connect() as conn:
            result = conn.exec_driver_sql(job, params)
            row = result.fetchone()
            if row is None:
                return None
            result = conn.exec_driver_sql(stages, params)
            return row, list(result.fetchall())

    def insert(
        self,
        statement: str,
        again: str,
        params: dict[str, Any],
        connection: SyncTarget,
        returning: bool,
    ) -> list[Any]:
        """Write with `statement`: on a kept connection (sent as `again`, its idempotent twin,
        if the connection turns out dead), or in the caller's transaction on `connection`.
        Returns the rows if `returning`."""
        if connection is None:
            return self._direct.run(statement, again, params)
        if isinstance(connection, Session | Connection):
            result = connection.execute(portable(statement), params)
            return rows(result, returning)
        if isinstance(connection, psycopg.Connection):
            # Tuples whatever the caller's row factory; no commit: the caller's transaction
            # (or its autocommit) decides when the job exists.
            with connection.cursor(row_factory=tuple_row) as cur:
                cur.execute(statement, params)
                return cur.fetchall() if returning else []
        raise TypeError(f"connection= takes a {SYNC_TAKES}, not {type(connection).__name__}")

    def copy(
        self,
        statement: str,
        chunks: Iterable[str],
        again: str,
        params: Params,
        meanwhile: Callable[[], object],
    ) -> None:
        """A COPY on a kept connection; see `DirectWrites.copy`."""
        self._direct.copy(statement, chunks, again, params, meanwhile=meanwhile)
