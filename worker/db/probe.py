"""A first session on a database: whether it answers, and whether `DATABASE_URL` leads to a
transaction pooler that `DATABASE_POOLER` does not declare.

Asked before a worker starts (`worker.daemon.db.wait_for_database`). What this does not do:
it does not wait or retry; a database that cannot be reached raises one of the seam's
`UNREACHABLE` errors, and the caller decides how long to try again.
"""

from __future__ import annotations

import os

import psycopg

from worker.db.connect import connect, pooled

APPLICATION_NAME = "durable-worker"

# The probe's statements name a prepared statement, which no parameter can: each is formatted
# with the probe's own name, made of the process id alone.
_PREPARE = "PREPARE {name} AS SELECT 1"
_DEALLOCATE = "DEALLOCATE {name}"
_IS_PREPARED = "SELECT 1 FROM pg_prepared_statements WHERE name = %s"


def undeclared_pooler(url: str) -> bool:
    """Open a session on `url`: whether it leads to a transaction pooler that the settings do
    not declare (never when they declare one)."""
    with connect(url, APPLICATION_NAME) as conn:
        return not pooled() and _shares_sessions(url, conn)


def _shares_sessions(url: str, conn: psycopg.Connection[object]) -> bool:
    """Whether a statement `conn` prepares is seen by another connection to `url`: a pooler in
    transaction mode handing one server session to its clients in turn (never so directly).

    The other connection looks the statement up in `pg_prepared_statements` instead of
    executing it, so that not finding it (a direct connection, a pooler in session mode) writes
    no error to the server's log. A pooler whose sessions are all busy may hand the other
    connection a different one: then this says False, and the first clash of prepared
    statements says it instead.
    """
    name = f"durable_worker_probe_{os.getpid()}"
    with connect(url, APPLICATION_NAME) as other:
        conn.execute(_PREPARE.format(name=name))
        shared = _deallocate_if_prepared(other, name)
        if not shared:
            _deallocate_if_prepared(conn, name)
    return shared


def _deallocate_if_prepared(conn: psycopg.Connection[object], name: str) -> bool:
    """Deallocate statement `name` from the session `conn` reaches now, if it is prepared there;
    whether it was."""
    # One transaction, so that a transaction pooler keeps both statements on one server session.
    with conn.transaction():
        found = conn.execute(_IS_PREPARED, (name,)).fetchone()
        if found is not None:
            conn.execute(_DEALLOCATE.format(name=name))
    return found is not None
