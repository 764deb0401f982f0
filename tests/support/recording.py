"""The connection test tasks record their side effects on, from inside a worker process.

One per thread, opened on first use and again after the database dropped it, so a task running
through an outage records as soon as the server is back. Tasks (`testtasks`, `chaos.faulttasks`)
write through it; tests read what they wrote with `support.db`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

_local = threading.local()


def task_connection() -> psycopg.Connection[Any]:
    """This thread's autocommit connection to the worker's database (`DATABASE_URL`)."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # Nothing prepared: the worker may reach its database through a transaction pooler.
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=None)
        _local.conn = conn
    return conn
