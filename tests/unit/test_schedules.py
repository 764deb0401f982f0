"""Periodic tasks without a database: `@task`'s schedule options, the ticks of an interval,
and the scheduler plugin on the in-memory driver (each tick enqueued once, none on a
schedule's first sight, one catch-up job after a downtime)."""

from __future__ import annotations

import asyncio
import doctest
import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from worker import schedules
from worker.daemon import Worker
from worker.daemon.plugins import Scheduler
from worker.daemon.plugins.scheduler import LATE_TICKS
from worker.db.memory import MemoryDriver
from worker.events import MemoryBus
from worker.models import JobStatus
from worker.schedules import SCHEDULES, Schedule, schedule_for
from worker.settings import Settings
from worker.tasks import REGISTRY, Task, task

URL = "postgresql://nobody@127.0.0.1:1/none"  # never connected to


def at(second: float) -> datetime:
    return datetime(2026, 5, 1, tzinfo=UTC) + timedelta(seconds=second)


class Clock:
    """A settable wall clock for the scheduler."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def task_name() -> Iterator[str]:
    """A fresh task name, unregistered again (with its schedule) after the test."""
    name = f"periodic_{uuid.uuid4().hex[:8]}"
    yield name
    REGISTRY.pop(name, None)
    SCHEDULES.pop(name, None)


def test_the_module_examples_run() -> None:
    assert doctest.testmod(schedules).failed == 0


def test_a_task_with_a_schedule_is_registered_with_it(task_name: str) -> None:
    @task(name=task_name, cron="*/5 * * * *", tz="Europe/Paris")
    def sweep(payload: dict[str, Any]) -> None:
        return None

    assert sweep({}) is None  # the function stays callable as before
    assert SCHEDULES[task_name].key == f"{task_name} cron */5 * * * * Europe/Paris"
    assert SCHEDULES[task_name].timezone == "Europe/Paris"
    assert task_name in REGISTRY


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "* * * * *", "every": 5}, "cron, every: give one schedule, not both"),
        ({"every": 0}, "every: must be a positive"),
        ({"every": -1.5}, "every: must be a positive"),
        ({"every": timedelta(0)}, "every: must be a positive"),
        ({"every": float("nan")}, "every: must be a positive"),
        ({"every": float("inf")}, "every: must be a positive"),
        ({"every": 1e12}, "every: must be a positive number of seconds, at most a century"),
        ({"every": True}, "every: expected seconds or a timedelta"),
        ({"every": "5"}, "every: expected seconds or a timedelta"),
        ({"cron": "61 * * * *"}, "cron: cron '61 * * * *': minute: 61 is out of range"),
        ({"cron": 5}, "cron: expected the expression as text"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz: unknown time zone 'Mars/Olympus'"),
        ({"every": 5, "tz": "Europe/Paris"}, "tz: applies to a cron schedule only"),
        ({"queue": "reports"}, "queue: applies to a periodic task only"),
        ({"every": 5, "queue": ""}, "queue: expected a name of 1 to 255 characters, not ''"),
        ({"every": 5, "queue": 7}, "queue: expected a name of 1 to 255 characters, not 7"),
    ],
)
def test_bad_schedule_options_are_refused_when_decorating_naming_the_option(
    task_name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("*", r"\*")):

        @task(name=task_name, **options)
        def job(payload: dict[str, Any]) -> None:
            return None

    assert task_name not in REGISTRY and task_name not in SCHEDULES


def test_an_interval_ticks_at_the_multiples_of_its_seconds_since_the_epoch() -> None:
    every = schedule_for("t", every=30)
    assert every is not None and every.key == "t every 30s"
    assert every.next_after(at(10)) == at(30)
    assert every.next_after(at(30)) == at(60)  # strictly after
    assert every.latest_at_or_before(at(59.9)) == at(30)
    assert every.latest_at_or_before(at(60)) == at(60)
    half = schedule_for("t", every=timedelta(milliseconds=500))
    assert half is not None and half.key == "t every 0.5s"
    assert half.next_after(at(10.2)) == at(10.5)
    with pytest.raises(ValueError, match="no time zone"):
        half.next_after(datetime(2026, 5, 1))


def test_a_changed_schedule_is_a_new_key() -> None:
    keys = {
        s.key
        for s in (
            schedule_for("t", every=30),
            schedule_for("t", every=60),
            schedule_for("t", cron="0 9 * * *"),
            schedule_for("t", cron="0  9 * * *"),  # the same expression, spaced otherwise
            schedule_for("t", cron="0 9 * * *", tz="Europe/Paris"),
        )
        if s is not None
    }
    assert keys == {
        "t every 30s",
        "t every 60s",
        "t cron 0 9 * * * UTC",
        "t cron 0 9 * * * Europe/Paris",
    }


def test_moving_a_schedules_jobs_to_another_queue_keeps_its_key_and_so_its_ticks() -> None:
    moved = schedule_for("t", every=30, queue="reports")
    assert moved is not None and moved.queue == "reports"
    assert moved.key == "t every 30s"


def test_two_schedulers_fire_each_tick_once_and_a_new_schedule_from_its_next_tick() -> None:
    driver, clock = MemoryDriver(), Clock(at(100.4))
    every = Schedule("t", every=1_000_000)
    first, second = Scheduler(driver, [every], clock), Scheduler(driver, [every], clock)

    async def main() -> list[list[str]]:
        fired = [await first.fire_due(), await second.fire_due()]  # first sight: no job
        for second_ in (101.0, 101.5, 102.2):
            clock.now = at(second_)
            fired += [await second.fire_due(), await first.fire_due()]
        return fired

    fired = asyncio.run(main())
    assert [len(ids) for ids in fired] == [0, 0, 1, 0, 0, 0, 1, 0]
    assert driver.schedules == {"t every 1s": at(102)}
    assert [job.task for job in driver.jobs.values()] == ["t", "t"]
    assert all(job.payload == {} and job.queue == "default" for job in driver.jobs.values())


def test_after_a_downtime_one_job_stands_for_every_missed_tick() -> None:
    driver, clock = MemoryDriver(), Clock(at(10.5))
    every = Schedule("t", every=1_000_000)

    async def main() -> list[str]:
        await Scheduler(driver, [every], clock).fire_due()  # seen at 10, then down
        clock.now = at(3600.5)
        return await Scheduler(driver, [every], clock).fire_due()  # a new worker starts

    assert len(asyncio.run(main())) == 1
    assert len(driver.jobs) == 1 and driver.schedules == {"t every 1s": at(3600)}


def test_a_running_worker_that_wakes_a_few_ticks_late_fires_each_but_a_stall_only_the_latest():
    driver, clock = MemoryDriver(), Clock(at(10.5))
    every = Schedule("t", every=1_000_000)
    scheduler = Scheduler(driver, [every], clock)

    async def main() -> list[int]:
        counts = [len(await scheduler.fire_due())]  # first sight at 10: no job
        clock.now = at(13.2)  # woke three ticks late
        counts.append(len(await scheduler.fire_due()))
        clock.now = at(13.2 + LATE_TICKS + 5)  # a stall of more than LATE_TICKS ticks
        counts.append(len(await scheduler.fire_due()))
        return counts

    assert asyncio.run(main()) == [0, 3, 1]
    due = sorted(job.run_at for job in driver.jobs.values())
    # Each tick once, a second apart (the memory driver keeps due times on its own clock).
    assert [b - a for a, b in itertools.pairwise(due[:3])] == pytest.approx([1.0, 1.0], abs=1e-3)


def test_the_scheduler_sleeps_until_the_next_tick() -> None:
    clock = Clock(at(10.25))
    scheduler = Scheduler(
        MemoryDriver(), [Schedule("t", every=1_000_000), Schedule("u", every=400_000)], clock
    )
    assert scheduler.seconds_to_next_tick() == pytest.approx(0.15)  # u's tick at 10.4


def test_a_tick_missed_in_an_outage_is_fired_once_the_database_is_back() -> None:
    driver = MemoryDriver()
    every = Schedule("t", every=100_000)  # 0.1 s, real time

    async def main() -> int:
        scheduler = asyncio.create_task(Scheduler(driver, [every]).run())
        await asyncio.sleep(0.35)
        driver.unreachable = True
        await asyncio.sleep(0.3)
        during = len(driver.jobs)
        driver.unreachable = False
        for _ in range(100):  # its backoff, grown in the outage, sets when it tries again
            if len(driver.jobs) > during:
                break
            await asyncio.sleep(0.05)
        assert not scheduler.done()  # the outage did not end it
        scheduler.cancel()
        return during

    during = asyncio.run(main())
    assert len(driver.jobs) > during  # it went on after the outage, without failing
    due = sorted(job.run_at for job in driver.jobs.values())
    assert len(set(due)) == len(due)


def test_a_worker_with_a_periodic_task_enqueues_and_runs_its_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver, ran = MemoryDriver(), []

    async def beat(payload: dict[str, Any]) -> None:
        ran.append(payload)

    monkeypatch.setitem(SCHEDULES, "beat", Schedule("beat", every=100_000))
    settings = Settings(DATABASE_URL=URL, WORKER_RETENTION_ENABLED=False, WORKER_POLL_MAX=0.1)

    async def main() -> None:
        registry = {"beat": Task("beat", beat, is_async=True)}
        worker = Worker(URL, settings, registry=registry, bus=MemoryBus(), driver=driver)
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(0.8)
        worker.request_stop()
        await asyncio.wait_for(run, 10)

    asyncio.run(main())
    assert len(ran) >= 3 and all(payload == {} for payload in ran)
    statuses = [job.status for job in driver.jobs.values()]
    # A tick fired as the worker stops may be handed back, pending; none failed.
    assert statuses.count(JobStatus.COMPLETED) == len(ran)
    assert set(statuses) <= {JobStatus.COMPLETED, JobStatus.PENDING}


def test_a_refused_firing_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class NoTable(MemoryDriver):
        async def fire_tick(
            self, key: str, task: str, spec: str, tick: datetime, queue: str
        ) -> str | None:
            raise psycopg.errors.UndefinedTable('relation "worker.schedules" does not exist')

    async def main() -> bool:
        scheduler = asyncio.create_task(Scheduler(NoTable(), [Schedule("t", every=1)]).run())
        await asyncio.sleep(0.1)
        ended = scheduler.done()
        scheduler.cancel()
        return ended

    assert asyncio.run(main()) is False
    assert "scheduled ticks failed (UndefinedTable: relation" in caplog.text
