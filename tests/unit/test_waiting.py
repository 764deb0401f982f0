"""Who is woken when a job finishes: the waiters of that job, every waiter when notifications
may have been missed, all through one subscription per database. No database: the notifier
is a stand-in that records subscriptions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from worker.client import waiting


class FakeSubscription:
    def __init__(self, channel: str, callback: Callable[[str | None], None]) -> None:
        self.channel, self.callback = channel, callback
        self.ready = threading.Event()
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeNotifier:
    def __init__(self) -> None:
        self.subscriptions: list[FakeSubscription] = []

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> FakeSubscription:
        sub = FakeSubscription(channel, callback)
        self.subscriptions.append(sub)
        return sub


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNotifier:
    notifier = FakeNotifier()
    names: list[str] = []

    def made(url: str, name: str) -> FakeNotifier:
        names.append(name)
        return notifier

    monkeypatch.setattr(waiting, "notifier", made)
    notifier.names = names  # type: ignore[attr-defined]
    return notifier


def test_many_waiters_share_one_worker_done_subscription_dropped_with_the_last(fake):
    waiters = waiting.DoneWaiters("postgresql://nowhere/db")
    with waiters.waiting("a", lambda: None), waiters.waiting("b", lambda: None):
        with waiters.waiting("a", lambda: None):
            assert len(fake.subscriptions) == 1
        (sub,) = fake.subscriptions
        assert sub.channel == "worker_done" and not sub.closed
        assert fake.names == [waiting.LISTENER_NAME]
    assert sub.closed


def test_a_notification_wakes_the_waiters_of_its_job_only(fake):
    waiters = waiting.DoneWaiters("postgresql://nowhere/db")
    woken: list[str] = []
    with (
        waiters.waiting("a", lambda: woken.append("a1")),
        waiters.waiting("a", lambda: woken.append("a2")),
        waiters.waiting("b", lambda: woken.append("b")),
    ):
        fake.subscriptions[0].callback("a")
        assert sorted(woken) == ["a1", "a2"]
        woken.clear()
        fake.subscriptions[0].callback("nobody-waits-for-this")
        assert woken == []


def test_a_possible_miss_wakes_every_waiter_to_recheck(fake):
    waiters = waiting.DoneWaiters("postgresql://nowhere/db")
    woken: list[str] = []
    with (
        waiters.waiting("a", lambda: woken.append("a")),
        waiters.waiting("b", lambda: woken.append("b")),
    ):
        fake.subscriptions[0].callback(None)
    assert sorted(woken) == ["a", "b"]


def test_a_waiter_that_left_is_not_woken(fake):
    waiters = waiting.DoneWaiters("postgresql://nowhere/db")
    woken: list[str] = []
    with waiters.waiting("b", lambda: None):
        with waiters.waiting("a", lambda: woken.append("a")):
            pass
        fake.subscriptions[0].callback("a")
        fake.subscriptions[0].callback(None)
    assert woken == []


def test_one_set_of_waiters_per_database():
    one = waiting.done_waiters("postgresql://nowhere/one")
    assert waiting.done_waiters("postgresql://nowhere/one") is one
    assert waiting.done_waiters("postgresql://nowhere/two") is not one


def test_a_blocking_waiter_is_woken_from_another_thread_before_its_recheck():
    wake = waiting.Wake()
    threading.Timer(0.05, wake.set).start()
    started = time.monotonic()
    wake.wait(10)
    assert time.monotonic() - started < 5


def test_an_asyncio_waiter_is_woken_from_another_thread_before_its_recheck():
    async def main() -> float:
        wake = waiting.AsyncWake()
        threading.Timer(0.05, wake.set).start()
        started = time.monotonic()
        await wake.wait(10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5


def test_an_asyncio_waiter_whose_loop_closed_is_not_woken_with_an_error():
    async def make() -> waiting.AsyncWake:
        return waiting.AsyncWake()

    wake = asyncio.run(make())
    wake.set()  # its loop is gone: nothing to wake, nothing raised


def test_a_wait_sleeps_no_longer_than_its_recheck_or_what_is_left():
    assert waiting.pause(None) == waiting.WAIT_RECHECK_SECONDS
    assert waiting.pause(0.5) == 0.5
    assert waiting.ready_for(None) == waiting.LISTEN_READY_SECONDS
    assert waiting.ready_for(time.monotonic() + 0.5) <= 0.5
