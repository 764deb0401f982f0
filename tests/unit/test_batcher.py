"""The group-commit batcher: grouping, locked rows, refused items, outages and the stop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from worker.daemon.db import LockWaits
from worker.db.batcher import Batcher, Verdict
from worker.db.driver import LOCKED, Locked


class Refused(ValueError):
    """Stands for a value the database cannot store."""


class Store:
    """A write function that records each statement's batch and can be held, refuse an item,
    lock a row for a while, or fail as an outage does."""

    def __init__(self) -> None:
        self.statements: list[list[str]] = []
        self.hold: asyncio.Event | None = None
        self.locked: dict[str, int] = {}  # item: how many more writes find it locked
        self.refuse: set[str] = set()
        self.outages = 0  # writes still to fail with OSError

    async def write(self, batch: list[str]) -> Sequence[str | Locked]:
        self.statements.append(list(batch))
        if self.hold is not None:
            await self.hold.wait()
        if self.outages:
            self.outages -= 1
            raise OSError("the database is unreachable")
        if self.refuse & set(batch):
            raise Refused("a value past a limit")
        answers: list[str | Locked] = []
        for item in batch:
            if self.locked.get(item, 0) > 0:
                self.locked[item] -= 1
                answers.append(LOCKED)
            else:
                answers.append(f"wrote {item}")
        return answers


def judge(batch: list[str], exc: Exception, alone: bool) -> Verdict:
    if isinstance(exc, Refused):
        return Verdict.SPLIT
    if isinstance(exc, OSError):
        return Verdict.RETRY
    return Verdict.RAISE


def test_items_handed_over_during_a_write_go_out_together_in_the_next() -> None:
    store = Store()

    async def main() -> None:
        store.hold = asyncio.Event()
        batcher: Batcher[str, str] = Batcher(store.write, judge=judge)
        flusher = asyncio.create_task(batcher.run())
        batcher.add("a")
        await asyncio.sleep(0.01)  # "a" is being written
        for item in "bcd":
            batcher.add(item)
        store.hold.set()
        await asyncio.wait_for(batcher.drain(), 2)
        flusher.cancel()

    asyncio.run(main())
    assert store.statements == [["a"], ["b", "c", "d"]]


def test_a_batch_is_never_larger_than_its_bound() -> None:
    store = Store()

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(store.write, judge=judge, max_batch=2)
        for item in "abcde":
            batcher.add(item)
        flusher = asyncio.create_task(batcher.run())
        await asyncio.wait_for(batcher.drain(), 2)
        flusher.cancel()

    asyncio.run(main())
    assert store.statements == [["a", "b"], ["c", "d"], ["e"]]


def test_a_locked_row_is_written_later_without_holding_up_the_others() -> None:
    store = Store()
    store.locked = {"b": 2}

    async def main() -> list[str | None]:
        batcher: Batcher[str, str] = Batcher(
            store.write, judge=judge, locks=LockWaits("it is written"), job_of=str
        )
        flusher = asyncio.create_task(batcher.run())
        answers = await asyncio.wait_for(
            asyncio.gather(batcher.run_one("a"), batcher.run_one("b"), batcher.run_one("c")), 5
        )
        assert batcher.pending == 0
        flusher.cancel()
        return list(answers)

    assert asyncio.run(main()) == ["wrote a", "wrote b", "wrote c"]
    assert store.statements == [["a", "b", "c"], ["b"], ["b"]]


def test_a_refused_item_is_written_alone_and_the_others_go_through() -> None:
    store = Store()
    store.refuse = {"bad"}
    written: list[str] = []

    def instead(item: str, exc: Exception) -> str | None:
        return "bad, recorded as refused"

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(
            store.write,
            judge=judge,
            refuse=instead,
            written=lambda batch, answers: written.extend(str(a) for a in answers or ()),
        )
        for item in ("a", "bad", "c"):
            batcher.add(item)
        flusher = asyncio.create_task(batcher.run())
        await asyncio.wait_for(batcher.drain(), 2)
        flusher.cancel()

    asyncio.run(main())
    assert written == ["wrote a", "wrote bad, recorded as refused", "wrote c"]


@pytest.mark.parametrize("instead", [True, False], ids=["written instead", "no stand-in"])
def test_an_item_refused_alone_in_its_batch_is_not_sent_again(instead: bool) -> None:
    """A refused value may be hundreds of megabytes: sending it a second time, to be refused
    again, would cost the server as much as the first time."""
    store = Store()
    store.refuse = {"bad"}
    judged: list[bool] = []

    def judging(batch: list[str], exc: Exception, alone: bool) -> Verdict:
        judged.append(alone)
        return judge(batch, exc, alone)

    async def main() -> str | None:
        batcher: Batcher[str, str] = Batcher(
            store.write,
            judge=judging,
            refuse=(lambda item, exc: f"{item}, recorded as refused") if instead else None,
        )
        flusher = asyncio.create_task(batcher.run())
        try:
            return await asyncio.wait_for(batcher.run_one("bad"), 2)
        finally:
            flusher.cancel()

    if instead:
        assert asyncio.run(main()) == "wrote bad, recorded as refused"
        assert store.statements == [["bad"], ["bad, recorded as refused"]]
    else:
        with pytest.raises(Refused):  # nothing to write instead: its waiter gets the error
            asyncio.run(main())
        assert store.statements == [["bad"]]
    assert judged == [True]


def test_an_outage_keeps_the_batch_for_another_try_and_loses_nothing() -> None:
    store = Store()
    store.outages = 2
    retried: list[bool] = []

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(
            store.write, judge=judge, on_retry=lambda exc, first: retried.append(first)
        )
        for item in "ab":
            batcher.add(item)
        flusher = asyncio.create_task(batcher.run())
        await asyncio.wait_for(batcher.drain(), 5)
        flusher.cancel()

    asyncio.run(main())
    assert store.statements == [["a", "b"]] * 3
    assert retried == [True, False]  # told once as new, then as still going on


def test_an_error_judged_fatal_stops_the_flusher_and_its_waiters_learn_it() -> None:
    async def broken(batch: list[str]) -> Sequence[str | Locked]:
        raise RuntimeError("no outcome is written today")

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(broken, judge=judge)
        flusher = asyncio.create_task(batcher.run())
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(batcher.run_one("a"), 2)
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(flusher, 2)
        await asyncio.wait_for(batcher.drain(), 2)  # a stopped batcher holds up no stop

    asyncio.run(main())


def test_a_stop_writes_what_was_handed_over_from_other_threads() -> None:
    store = Store()

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(store.write, judge=judge, interval=60, wake_at=1000)
        flusher = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        await asyncio.to_thread(lambda: [batcher.add_threadsafe(i) for i in "abc"])
        await asyncio.wait_for(batcher.drain(), 2)  # long before the interval is up
        flusher.cancel()

    asyncio.run(main())
    assert store.statements == [["a", "b", "c"]]


def test_beyond_its_bound_the_oldest_item_handed_over_is_dropped() -> None:
    async def main() -> list[bool]:
        batcher: Batcher[str, str] = Batcher(Store().write, judge=judge, interval=60)
        return [batcher.add_threadsafe(item, bound=2) for item in "abcd"]

    assert asyncio.run(main()) == [False, False, True, True]


def test_a_batcher_runs_again_on_a_new_event_loop() -> None:
    store = Store()
    batcher: Batcher[str, str] = Batcher(store.write, judge=judge, interval=60, wake_at=1000)

    async def once(item: str) -> None:
        flusher = asyncio.create_task(batcher.run())
        await asyncio.sleep(0)
        batcher.add_threadsafe(item)
        await asyncio.wait_for(batcher.drain(), 2)
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)

    asyncio.run(once("a"))
    asyncio.run(once("b"))
    assert store.statements == [["a"], ["b"]]


def test_a_batcher_run_again_on_the_same_loop_drains_what_waits() -> None:
    store = Store()

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(store.write, judge=judge, interval=60, wake_at=1000)
        for item in "ab":
            flusher = asyncio.create_task(batcher.run())
            await asyncio.sleep(0)
            batcher.add_threadsafe(item)
            await asyncio.wait_for(batcher.drain(), 2)
            assert batcher.pending == 0
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    asyncio.run(main())
    assert store.statements == [["a"], ["b"]]


def test_an_outage_while_writing_one_by_one_keeps_the_rest_for_another_try() -> None:
    store = Store()
    store.refuse = {"bad"}

    async def write(batch: list[str]) -> Sequence[str | Locked]:
        if batch == ["b"] and store.outages == 0 and ["b"] not in store.statements:
            store.outages = 1  # the outage starts as "b" is written alone
        return await store.write(batch)

    async def main() -> None:
        batcher: Batcher[str, str] = Batcher(write, judge=judge)
        for item in ("a", "bad", "b"):
            batcher.add(item)
        flusher = asyncio.create_task(batcher.run())
        await asyncio.wait_for(batcher.drain(), 5)
        assert batcher.pending == 0
        flusher.cancel()

    asyncio.run(main())
    assert ["b"] in store.statements[-1:]  # written once the outage was over
    assert store.statements.count(["b"]) == 2


def test_a_fatal_error_one_by_one_leaves_every_unwritten_item_pending() -> None:
    store = Store()
    store.refuse = {"bad"}

    def fatal_alone(batch: list[str], exc: Exception, alone: bool) -> Verdict:
        return Verdict.RAISE if alone else Verdict.SPLIT

    async def main() -> int:
        batcher: Batcher[str, str] = Batcher(store.write, judge=fatal_alone)
        for item in ("a", "bad", "c", "d"):
            batcher.add(item)
        with pytest.raises(Refused):
            await asyncio.wait_for(batcher.run(), 2)
        return batcher.pending

    assert asyncio.run(main()) == 3  # "bad", "c" and "d"
