"""What the driver seam raises, which errors mean "the database is unreachable right now", and
the kind of each failure (`Failure`) that the HTTP edge and the CLI answer.

The daemon's retries, outage lines and refusals are decided on these names alone, whichever
driver runs under it: the PostgreSQL driver raises psycopg's errors (and `Refused`), the
in-memory one `OSError`; no module outside `worker.db` names psycopg's classes for it. What it
does not do: retry or log; the daemon does (`worker.daemon.db`).
"""

from __future__ import annotations

import logging
import time
from enum import Enum

import psycopg
import sqlalchemy.exc
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


class Failure(Enum):
    """What went wrong with a database operation, in the seam's words: the HTTP edge and the
    CLI answer a kind, never a driver's error class."""

    UNAVAILABLE = "unavailable"  # not reachable right now: the same call may go through later
    VALUE_REFUSED = "value refused"  # a value of the statement it cannot store or compute
    NOT_PERMITTED = "not permitted"  # the database role may not do this
    NO_SCHEMA = "no schema"  # the worker schema, or a part of it, is not there: not migrated
    STATEMENT_REFUSED = "statement refused"  # any other statement it refuses: a defect


# The errors of a connection or a pool that cannot serve a call now, from psycopg or from
# SQLAlchemy's engine around it.
UNREACHABLE = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    PoolTimeout,
)
# Every error `failure` gives a kind to.
CLASSIFIED = (
    *UNREACHABLE,
    psycopg.DataError,
    sqlalchemy.exc.DataError,
    psycopg.ProgrammingError,
    sqlalchemy.exc.ProgrammingError,
)
# What the database answers when a name of the worker schema is not there: its words are
# "... does not exist".
_MISSING = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedObject,
)


def failure(exc: BaseException) -> Failure | None:
    """The kind of a failed database operation; None for an error that is not one."""
    if not isinstance(exc, CLASSIFIED):
        return None
    if isinstance(exc, UNREACHABLE):
        return Failure.UNAVAILABLE
    if isinstance(exc, psycopg.DataError | sqlalchemy.exc.DataError):
        return Failure.VALUE_REFUSED
    # SQLAlchemy wraps the driver's error: the kind is the driver's.
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, psycopg.errors.InsufficientPrivilege):
        return Failure.NOT_PERMITTED
    if isinstance(cause, _MISSING):
        return Failure.NO_SCHEMA
    return Failure.STATEMENT_REFUSED
