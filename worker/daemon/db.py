"""The daemon's patience when the database goes away.

When PostgreSQL goes away (a restart, a failover, `pg_terminate_backend`, a cut network) every
statement fails with one of the `TRANSIENT` errors. `Patience` then logs one line naming the
cause, retries with capped exponential backoff, and logs one line when the database answers
again; nothing else in the daemon logs the outage above DEBUG. `LockWaits` paces the writes
skipped because another client holds a job's row locked. `wait_for_database` holds the start
of a worker until the database answers, and refuses to start one whose `DATABASE_URL` leads
to a transaction pooler that `DATABASE_POOLER` does not declare.

What this does not do: it does not tell a dead database from an unreachable one, and it does
not fail over by itself (point `DATABASE_URL` at a name that follows the primary).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from worker.db.backoff import Backoff
from worker.db.connect import MISPOOLED, POOLER_HINT, PoolerMismatch
from worker.db.errors import TRANSIENT, UNREACHABLE, describe
from worker.db.probe import undeclared_pooler
from worker.logs import fields

log = logging.getLogger("worker.daemon")
_job_log = logging.getLogger("worker.jobs")
T = TypeVar("T")


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
        backoff = Backoff()
        while True:
            started = time.monotonic()
            try:
                result = await op()
            except MISPOOLED as exc:  # a pooler the start did not catch: no retry mends it
                raise PoolerMismatch(f"{exc}: {POOLER_HINT}") from None
            except TRANSIENT as exc:
                self.failed(what, exc, started)
                if self._stopping() and not past_stop:
                    raise
                await asyncio.sleep(backoff.next())
                continue
            self.succeeded(started)
            return result


def wait_for_database(url: str, timeout: float | None) -> None:
    """Block until the database accepts a connection; used before the daemon starts.

    Logs one line when it is unreachable, then retries with backoff. With `timeout`, raises
    `DatabaseUnreachable` (naming the cause, never the password) after that many seconds.
    """
    started = time.monotonic()
    backoff = Backoff(first=0.25)
    warned = False
    while True:
        try:
            undeclared = undeclared_pooler(url)
        except UNREACHABLE as exc:
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
            delay = backoff.next()
            time.sleep(delay if timeout is None else min(delay, max(timeout - waited, 0.05)))
            continue
        if warned:
            waited = time.monotonic() - started
            log.warning(
                "database reachable after %.1f s; starting",
                waited,
                extra=fields("database.reachable", outage_seconds=round(waited, 3)),
            )
        if undeclared:
            raise UndeclaredPooler(
                f"{POOLER_HINT} (a statement prepared on one connection was found on another)"
            )
        return


class DatabaseUnreachable(Exception):
    """The database did not answer within the time the operator allowed (`--connect-timeout`)."""


class UndeclaredPooler(DatabaseUnreachable):
    """`DATABASE_URL` leads to a transaction pooler `DATABASE_POOLER` does not declare: every
    prepared statement would clash with another client's. The worker does not start; an
    `UndeclaredPooler` is a `DatabaseUnreachable` so that it ends `worker run` the same way,
    in one line."""
