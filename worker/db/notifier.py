"""One LISTEN connection per process and database, shared by everything that waits for news.

The claim loop hears of new jobs (`worker_jobs`) and cancel requests (`worker_cancel`), job
handles hear that their job finished (`worker_done`), and SSE streams hear of new progress
events (`worker_events`), all through the one `Notifier` of their database: one connection,
one reconnect policy, however many waiters. A background thread owns the connection; it calls
each subscriber's callback from that thread with the notification's payload, and with `None`
whenever notifications may have been missed (the connection was lost, or made again), so that
every subscriber reads its state afresh then.

    subscription = notifier(url).subscribe("worker_done", on_done)
    subscription.ready.wait(5)     # LISTEN is in place: nothing sent from now on is missed
    ...
    subscription.close()

It listens on `WORKER_LISTEN_URL` when that is set (a direct connection to the database, for
a `DATABASE_URL` that leads to a pooler). Behind a pooler in transaction mode without one it
does not listen at all, and says so once: subscriptions are `ready` at once and hear nothing,
and every subscriber goes by its own polling.

What this does not do: it does not deliver what was sent while it was not listening (nothing
can: PostgreSQL keeps no notification for a session that was not listening), so every
subscriber must also look for itself, on `None` and now and then. Its thread ends once no
one has been subscribed for `LINGER_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from worker.db.backoff import Backoff
from worker.db.connect import connect, listen_url
from worker.logs import fields
from worker.settings import get_settings

log = logging.getLogger("worker.notifier")

Callback = Callable[[str | None], None]

LINGER_SECONDS = 30.0  # an idle notifier keeps its connection this long for the next waiter


class Subscription:
    """One subscriber's hold on a channel; `close` it (or use it as a context manager)."""

    def __init__(self, notifier: Notifier, channel: str, callback: Callback) -> None:
        self.channel = channel
        self.callback = callback
        # Set while LISTEN on the channel is in place; at once, for good, where no notifier can
        # listen (behind a transaction pooler): waiting for it would only delay the subscriber.
        self.ready = threading.Event()
        self._notifier = notifier

    async def wait_ready(self, timeout: float) -> bool:
        """The asyncio `ready.wait(timeout)`."""
        deadline = time.monotonic() + timeout
        while not self.ready.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.ready.is_set()

    def close(self) -> None:
        self._notifier._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Notifier:
    """The LISTEN connection of one database; see the module's docs. Thread-safe."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.listen_url = listen_url(url)  # None: nowhere to listen, subscribers poll
        # The session's name in pg_stat_activity, unless the URL or PGAPPNAME names it.
        self.name = name
        self._lock = threading.Lock()
        self._subscriptions: dict[int, Subscription] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._idle_since: float | None = None
        self._said_deaf = False

    def subscribe(self, channel: str, callback: Callback) -> Subscription:
        """Call `callback(payload)` from the notifier's thread for each notification on
        `channel`, and `callback(None)` whenever some may have been missed."""
        sub = Subscription(self, channel, callback)
        if self.listen_url is None:
            self._deaf(sub)
            return sub
        with self._lock:
            self._subscriptions[next(self._tokens)] = sub
            self._idle_since = None
            # A thread that died anyway (an error outside its loop) is replaced.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="notifier", daemon=True)
                self._thread.start()
        self._poke()
        return sub

    def subscribe_async(self, channel: str, callback: Callback) -> Subscription:
        """`subscribe`, with `callback` run on the calling coroutine's event loop instead."""
        loop = asyncio.get_running_loop()

        def hop(payload: str | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: its subscriber is gone
                loop.call_soon_threadsafe(callback, payload)

        return self.subscribe(channel, hop)

    def _deaf(self, sub: Subscription) -> None:
        sub.ready.set()
        with self._lock:
            first, self._said_deaf = not self._said_deaf, True
        if first:
            s = get_settings()
            log.info(
                "no notifications behind a transaction pooler (DATABASE_POOLER=transaction, "
                "no WORKER_LISTEN_URL): new jobs are found by polling every %g to %g s",
                s.poll_min,
                s.poll_max,
                extra=fields("listener.off", poll_min=s.poll_min, poll_max=s.poll_max),
            )

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            for token, held in list(self._subscriptions.items()):
                if held is sub:
                    del self._subscriptions[token]
        sub.ready.clear()
        self._poke()

    def retire_if_unused(self) -> None:
        """Close the connection now, not `LINGER_SECONDS` later, if no one is subscribed (a
        worker that stopped)."""
        with self._lock:
            if not self._subscriptions:
                self._idle_since = -LINGER_SECONDS
        self._poke()

    def _poke(self) -> None:
        if self.listen_url is None:  # no thread ever reads the pipe: a write would fill it
            return
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _subscribers(self, channel: str | None = None) -> list[Subscription]:
        with self._lock:
            subs = list(self._subscriptions.values())
        return subs if channel is None else [s for s in subs if s.channel == channel]

    def _tell(self, subs: list[Subscription], payload: str | None) -> None:
        for sub in subs:
            try:
                sub.callback(payload)
            except Exception:  # one subscriber's bug must not deafen the others
                log.exception("a notification subscriber failed")

    def _retire_if_idle(self) -> bool:
        with self._lock:
            if self._subscriptions:
                self._idle_since = None
                return False
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since < LINGER_SECONDS:
                return False
            self._thread = None
            return True

    def _run(self) -> None:
        backoff = Backoff()
        lost: str | None = None
        while True:
            try:
                with connect(self.listen_url or self.url, self.name) as conn:
                    if lost is not None:
                        log.info("listener reconnected", extra=fields("listener.reconnected"))
                        lost = None
                    backoff.reset()
                    if self._serve(conn):
                        return
            except Exception as exc:  # any error: the thread must outlive it, or no one hears
                for sub in self._subscribers():
                    sub.ready.clear()
                if lost is None:
                    lost = type(exc).__name__
                    unexpected = not isinstance(exc, psycopg.Error | OSError)
                    log.warning(
                        "listener lost (%s); polling until it is back",
                        lost,
                        exc_info=exc if unexpected else None,
                        extra=fields("listener.lost", error=lost),
                    )
                self._tell(self._subscribers(), None)  # each looks for itself meanwhile
                if self._retire_if_idle():
                    return
                time.sleep(backoff.next())

    def _serve(self, conn: psycopg.Connection[Any]) -> bool:
        """Listen on `conn` until it fails (raises) or the notifier retires (returns True)."""
        listening: set[str] = set()
        pgconn = conn.pgconn
        # Notifications that arrive while a LISTEN runs reach psycopg's handlers, not us.
        conn.add_notify_handler(lambda n: self._tell(self._subscribers(n.channel), n.payload))
        first = True
        while True:
            wanted = {sub.channel for sub in self._subscribers()}
            for channel in sorted(wanted - listening, key=_order):
                conn.execute(f"LISTEN {channel}")
                listening.add(channel)
            for channel in listening - wanted:
                conn.execute(f"UNLISTEN {channel}")
                listening.discard(channel)
            for sub in self._subscribers():
                if sub.channel in listening:
                    sub.ready.set()
            if first:
                first = False
                self._tell(self._subscribers(), None)  # what was sent before we listened
            if not wanted and self._retire_if_idle():
                return True
            readable, _, _ = select.select([pgconn.socket, self._wake_r], [], [], 1.0)
            if self._wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            if pgconn.socket in readable:
                pgconn.consume_input()
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the listening connection was closed")
                while (note := pgconn.notifies()) is not None:
                    channel = note.relname.decode()
                    self._tell(self._subscribers(channel), note.extra.decode())


def _order(channel: str) -> tuple[int, str]:
    # New jobs first, so that the daemon's claim loop is woken at the earliest.
    return (0 if channel == "worker_jobs" else 1, channel)


_notifiers: dict[str, Notifier] = {}
_notifiers_lock = threading.Lock()


def notifier(url: str, name: str = "durable-worker-listener") -> Notifier:
    """The process's notifier for `url` (made on first use, named by its first caller)."""
    with _notifiers_lock:
        found = _notifiers.get(url)
        if found is None:
            found = _notifiers[url] = Notifier(url, name)
        return found


def _forget_notifiers() -> None:
    # A forked child has none of its parent's threads: it opens its own notifiers.
    global _notifiers_lock
    _notifiers.clear()
    _notifiers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_notifiers)
