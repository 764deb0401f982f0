"""The daemon's connections: a pool, the claim loop's own, and patience when the database goes away.

When PostgreSQL goes away (a restart, a failover, `pg_terminate_backend`, a cut network) every
statement fails with one of the `TRANSIENT` errors. `Patience` then logs one line naming the
cause, retries with capped exponential backoff, and logs one line when the database answers
again; nothing else in the daemon logs the outage above DEBUG. Broken pooled connections are
dropped on first use and replaced. The pool gives up each reconnection attempt after
`RECONNECT_WINDOW` seconds, so the next statement starts a fresh attempt at once: left to
itself, the pool's backoff keeps doubling through a long outage and would leave the worker
idle for half a minute after the database came back.

What this does not do: it does not tell a dead database from an unreachable one, and it does
not fail over by itself (point `DATABASE_URL` at a name that follows the primary).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import Format
from psycopg.types.json import set_json_loads
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from worker.db.connect import async_pool, connect
from worker.logs import fields, scrub

log = logging.getLogger("worker.daemon")
_job_log = logging.getLogger("worker.jobs")
T = TypeVar("T")

# Errors that mean "the database is not reachable right now", as opposed to a bad statement.
# A read-only transaction error is what a demoted primary answers during a failover.
TRANSIENT = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
    PoolTimeout,
    OSError,
)

POOL_CAP = 16  # connections per worker process, whatever its concurrency
POOL_WAIT = 5.0  # seconds a statement waits for a pooled connection before it is retried
RECONNECT_WINDOW = 3.0  # seconds the pool keeps retrying one reconnection before giving up


def pool_size(concurrency: int) -> int:
    """Connections the daemon may open (its pool and the claim loop's) for a given
    `WORKER_CONCURRENCY`.

    A running job holds no connection (see `Worker`): the claim loop, the completer and the
    duties need one each, stage bookkeeping a few more. Capped, so that many busy workers do
    not exhaust the server's `max_connections`.

    >>> pool_size(1), pool_size(10), pool_size(1000)
    (4, 8, 16)
    """
    return min(3 + max(1, concurrency // 2), POOL_CAP)


class UnreadableJSON:
    """Stands in for a JSON value this process cannot decode (nested too deeply for Python).

    PostgreSQL accepts JSON nested thousands of levels deep; Python's decoder stops near its
    recursion limit (about 1000). A job carrying such a value fails with a clear error instead
    of taking the claim of every other job down with it.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableJSON({self.reason!r})"


def _loads(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        return UnreadableJSON("it is nested more deeply than Python's JSON decoder allows")


# Ids are read as text: the daemon only passes them on (as keys, log fields, parameters), and a
# UUID object built per id, then turned back into text several times, cost about 7% of the
# drain's CPU. (The text loader psycopg uses itself: its C one, when installed.)
_TEXT_LOADER = (
    psycopg.adapters.get_loader(psycopg.adapters.types["text"].oid, Format.TEXT) or TextLoader
)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_loads, conn)
    conn.adapters.register_loader("uuid", _TEXT_LOADER)


class LockWaits:
    """Paces the writes a statement skipped because another client holds the job's row locked.

    A write is tried again soon after its first skip (a cancel holds a row for milliseconds),
    then every `LOCKED_RETRY` seconds, with one warning naming the job (an open transaction
    holds it, perhaps in `psql`).
    """

    LOCKED_RETRY = 0.5

    def __init__(self, what: str) -> None:
        self._what = what  # what waits, for the warning: "its outcome is written"
        self._times: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._times)

    def skipped(self, job_ids: Iterable[str]) -> float:
        """Note a skip of each job's write; returns the seconds before trying them again."""
        first = False
        for job_id in job_ids:
            times = self._times[job_id] = self._times.get(job_id, 0) + 1
            first = first or times == 1
            if times == 2:
                _job_log.warning(
                    "job %s: its row is locked by another client (an open transaction?); %s "
                    "once the lock is released",
                    job_id,
                    self._what,
                    extra=fields("job.write_locked", job_id=str(job_id)),
                )
        return self.LOCKED_RETRY / 10 if first else self.LOCKED_RETRY

    def done(self, job_id: str) -> None:
        """The job's write went through, or the job is no longer ours: it waits no more."""
        self._times.pop(job_id, None)


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
            _PoolNoise.last_error = str(args[1]).strip().splitlines()[0]
            _PoolNoise.last_error_at = time.monotonic()
        return False


_pool_logger = logging.getLogger("psycopg.pool")
if not any(isinstance(f, _PoolNoise) for f in _pool_logger.filters):
    _pool_logger.addFilter(_PoolNoise())


async def _configure_claims(conn: psycopg.AsyncConnection[Any]) -> None:
    await _configure(conn)
    # The claim is planned once per session, not once per claim. Left to choose, PostgreSQL
    # plans it anew every time (in a drain, 0.66 ms per claim, beside 0.62 ms to run it): its
    # plan for "LIMIT n" looks cheaper than one for any limit. The claim is written so that the
    # plan for any limit makes the same index probes (see `sql._CLAIMED`).
    await conn.execute("SET plan_cache_mode = force_generic_plan")


def make_pool(url: str, concurrency: int) -> AsyncConnectionPool:
    """The pool of every statement but the claim: `pool_size(concurrency)` less the claim's."""
    size = pool_size(concurrency) - 1
    return _pool(url, min(2, size), size, _configure, "worker")


def claim_pool(url: str) -> AsyncConnectionPool:
    """The claim loop's own connection: its session keeps the claim's plan."""
    return _pool(url, 1, 1, _configure_claims, "worker-claims")


def _pool(
    url: str,
    min_size: int,
    max_size: int,
    configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
    name: str,
) -> AsyncConnectionPool:
    # Named "durable-worker" whichever pool: operators and the tests find the daemon's
    # sessions by that name; the pool's own name tells them apart in its logs.
    pool = async_pool(
        url,
        "durable-worker",
        min_size=min_size,
        max_size=max_size,
        configure=configure,
        timeout=POOL_WAIT,
        reconnect_timeout=RECONNECT_WINDOW,
    )
    pool.name = name
    return pool


def describe(exc: BaseException) -> str:
    """One line saying why the database could not be used, without secrets."""
    if isinstance(exc, PoolTimeout):
        recent = time.monotonic() - _PoolNoise.last_error_at < 60
        if recent and _PoolNoise.last_error:
            return f"cannot connect: {scrub(_PoolNoise.last_error)}"
        return "no connection available in time"
    lines = str(exc).strip().splitlines()
    detail = f": {scrub(lines[0])}" if lines else ""
    return f"{type(exc).__name__}{detail}"


class Patience:
    """Retries an operation while the database is unreachable, with capped exponential backoff.

    Logs one line when the database goes away and one when it is back, not one per try, however
    many parts of the daemon are waiting. A statement only speaks for the moment it was sent:
    one that began before the outage and succeeds inside it does not end it, and one that began
    before the recovery and fails after it does not start another.

    Nor does one answer end an outage: a server shutting down still answers on sessions it has
    not cut yet. The recovery is `confirm`ed on a new session, in the background (the statement
    that went through goes on at once). Statements that keep going through for `SURE_AFTER`
    seconds end the outage too, for a server that refuses new sessions but serves the pool's
    (at its connection limit, say).
    """

    SURE_AFTER = 5.0

    def __init__(
        self, stopping: Callable[[], bool], confirm: Callable[[], Awaitable[None]]
    ) -> None:
        self._stopping = stopping
        self._confirm = confirm
        self.down_since: float | None = None
        self._up_since = 0.0
        self._answering_since: float | None = None  # statements go through again since then
        self._last_answer = 0.0
        self._confirming: asyncio.Task[None] | None = None
        self._next_confirm = 0.0

    def failed(self, what: str, exc: BaseException, started: float) -> None:
        """Note a transient failure of a statement sent at `started` (`time.monotonic()`)."""
        if self.down_since is not None:
            if started >= self.down_since:
                self._answering_since = None
            return
        if started >= self._up_since:
            self.down_since = time.monotonic()
            reason = describe(exc)
            log.warning(
                "database unreachable (%s, while %s); the worker keeps running and retries "
                "with backoff",
                reason,
                what,
                extra=fields("database.unreachable", error=reason, during=what),
            )

    def succeeded(self, started: float) -> None:
        """Note that a statement sent at `started` went through (ends the outage, if any)."""
        if self.down_since is None or started < self.down_since:
            return
        now = time.monotonic()
        if self._answering_since is None or now - self._last_answer > 1.0:
            self._answering_since = now  # answers a second apart or more are not a stream
        elif now - self._answering_since >= self.SURE_AFTER:
            self._recovered()
            return
        self._last_answer = now
        if self._confirming is None and now >= self._next_confirm:
            self._confirming = asyncio.create_task(self._confirm_recovery(self.down_since))

    async def _confirm_recovery(self, outage: float) -> None:
        try:
            async with asyncio.timeout(self.SURE_AFTER):
                await self._confirm()
        except Exception:  # not back yet (refused, timed out): a later answer tries again
            self._next_confirm = time.monotonic() + 1.0
            return
        finally:
            self._confirming = None
        if self.down_since == outage:
            self._recovered()

    def _recovered(self) -> None:
        assert self.down_since is not None
        self._up_since = time.monotonic()  # failures of statements sent before are old news
        seconds = self._up_since - self.down_since
        self.down_since = self._answering_since = None
        log.warning(
            "database reachable again after %.1f s; resuming",
            seconds,
            extra=fields("database.reachable", outage_seconds=round(seconds, 3)),
        )

    async def confirmed(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for a recovery confirmation under way."""
        if self._confirming is not None:
            await asyncio.wait([self._confirming], timeout=timeout)

    async def close(self) -> None:
        """Stop a confirmation under way (before the pool closes)."""
        if self._confirming is not None:
            self._confirming.cancel()
            await asyncio.wait([self._confirming])  # a cancel of the caller still propagates

    async def run(self, what: str, op: Callable[[], Awaitable[T]], *, past_stop: bool = False) -> T:
        """Run `op`, again and again while the database is unreachable. Once the worker is
        stopping, the first failure is raised instead, unless `past_stop` (the caller's shutdown
        bounds the wait)."""
        delay = 0.1
        while True:
            started = time.monotonic()
            try:
                result = await op()
            except TRANSIENT as exc:
                self.failed(what, exc, started)
                if self._stopping() and not past_stop:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.succeeded(started)
            return result


def wait_for_database(url: str, timeout: float | None) -> None:
    """Block until the database accepts a connection; used before the daemon starts.

    Logs one line when it is unreachable, then retries with backoff. With `timeout`, raises
    `DatabaseUnreachable` (naming the cause, never the password) after that many seconds.
    """
    started = time.monotonic()
    delay = 0.25
    warned = False
    while True:
        try:
            with connect(url, "durable-worker"):
                if warned:
                    waited = time.monotonic() - started
                    log.warning(
                        "database reachable after %.1f s; starting",
                        waited,
                        extra=fields("database.reachable", outage_seconds=round(waited, 3)),
                    )
                return
        except psycopg.OperationalError as exc:
            reason = describe(exc).removeprefix("OperationalError: ")
            waited = time.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise DatabaseUnreachable(
                    f"cannot reach the database after {timeout:g} s: {reason}"
                ) from None
            if not warned:
                warned = True
                bound = f"up to {timeout:g} s" if timeout is not None else "until it answers"
                log.warning(
                    "database unreachable (%s); retrying %s",
                    reason,
                    bound,
                    extra=fields("database.unreachable", error=reason, during="starting"),
                )
            pause = delay if timeout is None else min(delay, max(timeout - waited, 0.05))
            time.sleep(pause)
            delay = min(delay * 2, 5.0)


class DatabaseUnreachable(Exception):
    """The database did not answer within the time the operator allowed (`--connect-timeout`)."""


class Refused(psycopg.DataError):
    """PostgreSQL refused a statement for a value past one of its limits (a JSON string over
    256 MB, say). Its own error class is an `OperationalError`, as an outage's is: retried like
    one, the statement would be refused forever and hold up everything written with it."""


async def fetch(
    pool: AsyncConnectionPool,
    query: str,
    params: dict[str, Any],
) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        try:
            cur = await conn.execute(query, params)
        except psycopg.errors.ProgramLimitExceeded as exc:
            raise Refused(str(exc).strip()) from exc
        # `rownumber` is None without a result set; `description` would build its columns.
        return await cur.fetchall() if cur.rownumber is not None else []
