"""Group commit: what is handed over while a write is in flight goes out together in the next.

One mechanism behind the three batched writes: job outcomes (`worker.daemon.completer`),
stage bookkeeping (`worker.daemon.stage_writes`) and progress events
(`worker.events.postgres`). A flusher takes up to `max_batch` items, writes them in one
statement (one commit), and takes the next batch at once: at low load that is one item per
statement (lowest latency), under load it batches by itself. With `interval`, a flusher
waits that long for more items unless `wake_at` are waiting already. Up to `flushers`
statements are in flight at once.

A write answers each item, in order: its result, or `LOCKED` when another client holds the
job's row locked. A locked item is not waited for (it would hold up every item behind it): it
is set aside and written again a little later (a `Pacer`, the daemon's `LockWaits`, says
when), and its waiter waits.

What differs between the uses is a parameter: `judge` says what an error of a write means,
told whether the write held one item alone (`Verdict.SPLIT`: some item was refused, write them
one by one, and an item refused alone is not sent again; `RETRY`: keep the batch and
try again after a backoff; `FAIL`: the batch's waiters get the error; `RAISE`: the flusher
stops, and with it the worker), `refuse` what becomes of an item refused on its own (an item
to write instead, or None to drop it), and `written` what to do with what went through.

What this does not do: it does not retry an outage by itself unless told to (`RETRY`), and it
does not order one job's writes: a job that must see a write committed awaits it (`run_one`).

    batcher = Batcher(write, judge=lambda batch, exc, alone: Verdict.RAISE)
    flusher = asyncio.create_task(batcher.run())
    batcher.add(item)                 # or: result = await batcher.run_one(item)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import Enum
from typing import Generic, Protocol, TypeVar

from worker.db.backoff import Backoff
from worker.db.driver import Locked

I = TypeVar("I")  # noqa: E741 - an item handed over
R = TypeVar("R")  # what its write answers


class Pacer(Protocol):
    """Paces the writes skipped on a locked row (the daemon's `LockWaits`)."""

    def __len__(self) -> int: ...

    def skipped(self, job_ids: Iterable[str]) -> float:
        """Note a skip of each job's write; returns the seconds before trying them again."""

    def done(self, job_id: str) -> None:
        """The job's write went through, or the job is no longer ours."""


class Verdict(Enum):
    """What an error of a write means for its batch."""

    SPLIT = "split"  # an item was refused: write them one at a time
    RETRY = "retry"  # keep the batch, try again after a backoff
    FAIL = "fail"  # the waiters of the batch get the error; the flusher goes on
    RAISE = "raise"  # the flusher stops on the error


_Entry = tuple[I, "asyncio.Future[R | None] | None"]


class Batcher(Generic[I, R]):
    """Items handed over from the event loop (or, `add_threadsafe`, from any thread), written
    in batches by `run`'s flushers; see the module's docs."""

    def __init__(
        self,
        write: Callable[[list[I]], Awaitable[Sequence[R | Locked] | None]],
        *,
        judge: Callable[[list[I], Exception, bool], Verdict],
        refuse: Callable[[I, Exception], I | None] | None = None,
        written: Callable[[list[I], Sequence[R | Locked] | None], None] | None = None,
        max_batch: int | None = None,
        flushers: int = 1,
        interval: float | None = None,
        wake_at: int = 1,
        locks: Pacer | None = None,
        job_of: Callable[[I], str] | None = None,
        on_retry: Callable[[Exception, bool], None] | None = None,
        name: str = "batcher",
    ) -> None:
        self._write, self._written, self._name = write, written, name
        # What an error means, and what becomes of a refused item or a retried batch.
        self._judge, self._refuse, self._on_retry = judge, refuse, on_retry
        # How much goes in one statement, how many statements at once, and when.
        self._max_batch, self._flushers = max_batch, flushers
        self._interval, self._wake_at = interval, wake_at
        # Items whose row was locked: when to try them again.
        self._locks, self._job_of = locks, job_of
        self._queue: deque[_Entry[I, R]] = deque()
        self._lock = threading.Lock()  # `add_threadsafe` appends from other threads
        self._in_flight = 0
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retrying = False  # the last write failed and its batch waits for another try
        self._ended = False  # the flushers stopped

    # -- handing over -----------------------------------------------------------------------

    def add(self, item: I) -> None:
        """Queue `item` for the next batch (on the event loop)."""
        self._queue.append((item, None))
        self._handed_over(len(self._queue))

    async def run_one(self, item: I) -> R | None:
        """Queue `item` and wait until it is written; returns its write's answer."""
        # Cancelling the waiter (shutdown) cancels its future, which its batch then skips.
        future: asyncio.Future[R | None] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._handed_over(len(self._queue))
        return await future

    def add_threadsafe(self, item: I, bound: int | None = None) -> bool:
        """Queue `item` from any thread; beyond `bound` waiting items the oldest is dropped
        (returns True then). Wakes a flusher once `wake_at` items wait."""
        with self._lock:
            self._queue.append((item, None))
            dropped = bound is not None and len(self._queue) > bound
            if dropped:
                self._queue.popleft()
            size = len(self._queue)
        if size >= self._wake_at and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
                self._loop.call_soon_threadsafe(self._handed_over, size)
        return dropped

    def _handed_over(self, size: int) -> None:
        self._idle.clear()
        if self._interval is None or size >= self._wake_at:
            self._ready.set()

    @property
    def pending(self) -> int:
        """Items not written yet: waiting, in a statement, or set aside on a locked row."""
        return len(self._queue) + self._in_flight + (len(self._locks) if self._locks else 0)

    # -- flushing ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Flush until cancelled, or until a write fails on an error judged `RAISE`.

        May be run again after it ended, on the same loop or another: what is left is kept."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            # An event binds to the loop that first waits on it: a new loop needs new ones.
            self._ready, self._idle = asyncio.Event(), asyncio.Event()
            if self._queue:
                self._ready.set()
            self._settle_idle()
        self._loop = loop
        self._ended = False
        flushers = [
            asyncio.create_task(self._flush_forever(), name=f"{self._name}-{n}")
            for n in range(self._flushers)
        ]
        try:
            done, _ = await asyncio.wait(flushers, return_when=asyncio.FIRST_EXCEPTION)
            for flusher in done:
                flusher.result()
        finally:
            for flusher in flushers:
                flusher.cancel()
            await asyncio.gather(*flushers, return_exceptions=True)
            # Failed, or cancelled by the shutdown: nothing more is written, so a drain waits
            # no longer. What is left counts in `pending`.
            self._ended = True
            self._idle.set()

    async def _flush_forever(self) -> None:
        backoff = Backoff()
        while True:
            if self._interval is None:
                await self._ready.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval):
                        await self._ready.wait()
            self._ready.clear()
            while self._queue:
                if not await self.flush():
                    self._ready.clear()
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
            self._settle_idle()

    async def flush(self) -> bool:
        """Write one batch of what waits now; False if it failed and waits for another try."""
        with self._lock:
            n = len(self._queue) if self._max_batch is None else self._max_batch
            batch = [self._queue.popleft() for _ in range(min(n, len(self._queue)))]
        if not batch:
            return True
        self._in_flight += len(batch)
        try:
            return await self._write_batch(batch)
        finally:
            self._in_flight -= len(batch)

    async def _write_batch(self, batch: list[_Entry[I, R]]) -> bool:
        items = [item for item, _ in batch]
        try:
            answers = await self._write(items)
        except Exception as exc:
            alone = len(batch) == 1
            verdict = self._judge(items, exc, alone)
            if verdict is Verdict.SPLIT:
                if not alone:
                    return await self._one_by_one(batch)
                # Written alone already: refused, it is not sent again.
                await self._settle_refused(batch[0], exc, verdict)
                self._retrying = False
                return True
            if verdict is Verdict.RETRY:
                self._retry_later(batch, exc)
                return False
            _fail(batch, exc)
            if verdict is Verdict.RAISE:
                # Nothing writes them now: they count as not written (`pending`).
                with self._lock:
                    self._queue.extendleft(reversed(batch))
                raise
            return True
        except BaseException as exc:  # cancelled: the waiters learn it too
            _fail(batch, exc)
            raise
        self._retrying = False
        self._answer(batch, answers)
        return True

    def _retry_later(self, batch: list[_Entry[I, R]], exc: Exception) -> None:
        if self._on_retry is not None:
            self._on_retry(exc, not self._retrying)
        self._retrying = True
        with self._lock:
            self._queue.extendleft(reversed(batch))

    async def _one_by_one(self, batch: list[_Entry[I, R]]) -> bool:
        """A batch was refused for one of its items: alone, each one succeeds or fails on its
        own account, and the others are not held up by it. False if an outage came meanwhile:
        what is left waits for another try."""
        for n, (item, future) in enumerate(batch):
            try:
                self._answer([(item, future)], await self._write([item]))
            except Exception as exc:
                verdict = self._judge([item], exc, True)
                if verdict is Verdict.RETRY:
                    self._retry_later(batch[n:], exc)
                    return False
                if verdict is Verdict.RAISE:
                    _fail(batch[n:], exc)
                    # Nothing writes them now: they count as not written (`pending`).
                    with self._lock:
                        self._queue.extendleft(reversed(batch[n:]))
                    raise
                await self._settle_refused((item, future), exc, verdict)
        self._retrying = False
        return True

    async def _settle_refused(self, entry: _Entry[I, R], exc: Exception, verdict: Verdict) -> None:
        """An item failed on its own: what `refuse` makes of a refused one is written instead;
        otherwise its waiter gets the error."""
        item, future = entry
        refuse = self._refuse if verdict is Verdict.SPLIT else None
        instead = refuse(item, exc) if refuse is not None else None
        if instead is None:
            _fail([entry], exc)
            return
        self._answer([(instead, future)], await self._write([instead]))

    def _answer(self, batch: list[_Entry[I, R]], answers: Sequence[R | Locked] | None) -> None:
        """Settle each item, or set it aside for another try if its job's row was locked."""
        if answers is None:
            for _, future in batch:
                _settle(future, None)
            if self._written is not None:
                self._written([item for item, _ in batch], None)
            return
        locked: list[_Entry[I, R]] = []
        # Only jobs set aside before have a pace to forget: most batches have none.
        locks = self._locks if self._locks is not None and len(self._locks) else None
        job_of = self._job_of
        for (item, future), answer in zip(batch, answers, strict=True):
            if isinstance(answer, Locked):
                locked.append((item, future))
                continue
            if locks is not None and job_of is not None:
                locks.done(job_of(item))
            if future is not None:
                _settle(future, answer)
        if self._written is not None:
            self._written([item for item, _ in batch], answers)
        if locked:
            self._set_aside(locked)

    def _set_aside(self, locked: list[_Entry[I, R]]) -> None:
        assert self._locks is not None and self._job_of is not None
        job_of = self._job_of

        def again() -> None:
            self._queue.extend(locked)
            self._handed_over(len(self._queue))

        delay = self._locks.skipped(job_of(item) for item, _ in locked)
        asyncio.get_running_loop().call_later(delay, again)

    def _settle_idle(self) -> None:
        if not self._queue and not self._in_flight and not (self._locks and len(self._locks)):
            self._idle.set()

    async def drain(self) -> None:
        """Wait until everything handed over so far is written (or the flushers have ended)."""
        while True:
            await self._idle.wait()
            if not self.pending or self._ended:
                return
            # Items handed over from another thread: the flushers are told at once.
            self._idle.clear()
            self._ready.set()


def _settle(future: asyncio.Future[R | None] | None, answer: R | None) -> None:
    if future is not None and not future.done():
        future.set_result(answer)


def _fail(batch: Iterable[_Entry[I, R]], exc: BaseException) -> None:
    for _, future in batch:
        if future is not None and not future.done():
            future.set_exception(exc)
