"""What the driver seam raises, and which errors mean "the database is unreachable right now".

The daemon's retries, outage lines and refusals are decided on these names alone, whichever
driver runs under it: the PostgreSQL driver raises psycopg's errors (and `Refused`), the
in-memory one `OSError`; no module outside `worker.db` names psycopg's classes for it. What it
does not do: retry or log; the daemon does (`worker.daemon.db`).
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg_pool import PoolTimeout

from worker.logs import first_line

# Errors that mean "the database is not reachable right now", as opposed to a bad statement.
# A read-only transaction error is what a demoted primary answers during a failover.
TRANSIENT = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
    PoolTimeout,
    OSError,
)
# Every error a database operation ends in, whichever driver: an outage (`TRANSIENT`) or a
# refusal (see `refused`).
DATABASE_ERRORS = (psycopg.Error, *TRANSIENT)
# The database refused a value of the statement (past a limit, or text it cannot store), not the
# statement itself: written without that value, the rest may go through.
VALUE_REFUSED = (psycopg.DataError,)
# A database the workers' release is ahead of: its table or functions are not there yet.
UNMIGRATED = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)


def refused(exc: BaseException) -> bool:
    """The database refused the statement (a missing table, a grant, a value it cannot store):
    tried again as it is, it would be refused again."""
    return isinstance(exc, psycopg.Error) and not isinstance(exc, TRANSIENT)


class _PoolNoise(logging.Filter):
    """Keeps the pool's per-attempt connection warnings out of the log, remembering the last
    connection error so the outage line can name the cause."""

    last_error: str | None = None
    last_error_at = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if str(record.msg).startswith("error connecting") and len(record.args or ()) >= 2:
            args = record.args
            assert isinstance(args, tuple)
            _PoolNoise.last_error = first_line(str(args[1]))
            _PoolNoise.last_error_at = time.monotonic()
        return False


_pool_logger = logging.getLogger("psycopg.pool")
if not any(isinstance(f, _PoolNoise) for f in _pool_logger.filters):
    _pool_logger.addFilter(_PoolNoise())


def describe(exc: BaseException) -> str:
    """One line saying why the database could not be used, without secrets."""
    if isinstance(exc, PoolTimeout):
        recent = time.monotonic() - _PoolNoise.last_error_at < 60
        if recent and _PoolNoise.last_error:
            return f"cannot connect: {_PoolNoise.last_error}"
        return "no connection available in time"
    detail = first_line(str(exc))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class Refused(psycopg.DataError):
    """PostgreSQL refused a statement for a value past one of its limits (a JSON string over
    256 MB, say). Its own error class is an `OperationalError`, as an outage's is: retried like
    one, the statement would be refused forever and hold up everything written with it."""


# The database refused some event (a job deleted meanwhile, a value it cannot store, a message
# past jsonb's size limit: an OperationalError by its class, but no outage).
EVENTS_REFUSED = (psycopg.IntegrityError, psycopg.DataError, psycopg.errors.ProgramLimitExceeded)


class Unsupported(NotImplementedError):
    """A driver was asked for a rule it does not keep (the in-memory driver and a concurrency
    key, say): refused at once, rather than the job running as if the rule held."""
