"""The local queue's claims, claim-ahead and hand-back, on the in-memory driver (no database)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from worker.daemon import Worker, local_queue
from worker.daemon.local_queue import State
from worker.db.memory import MemoryDriver
from worker.events import MemoryBus
from worker.models import JobStatus
from worker.settings import Settings
from worker.tasks import Task

# Never connected to: the worker runs on the memory driver and bus.
URL = "postgresql://nobody@127.0.0.1:1/none"


def settings(**values: Any) -> Settings:
    defaults = {"WORKER_RETENTION_ENABLED": False, "WORKER_POLL_MAX": 0.2}
    return Settings(DATABASE_URL=URL, **{**defaults, **values})


def registry(**fns: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    return {name: Task(name, fn, is_async=True) for name, fn in fns.items()}


@asynccontextmanager
async def running(
    driver: MemoryDriver, tasks: dict[str, Any], **values: Any
) -> AsyncIterator[Worker]:
    worker = Worker(URL, settings(**values), registry=tasks, bus=MemoryBus(), driver=driver)
    run = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, 10)


async def settled(driver: MemoryDriver, *ids: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while any(driver.jobs[i].status not in _TERMINAL for i in ids):
            await asyncio.sleep(0.005)


_TERMINAL = {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}


def test_every_job_runs_once_with_two_workers_on_one_queue() -> None:
    driver = MemoryDriver()
    ran: list[str] = []

    async def note(payload: dict[str, Any]) -> None:
        ran.append(payload["key"])
        await asyncio.sleep(0)

    async def main() -> None:
        ids = [driver.enqueue("note", {"key": str(i)}) for i in range(300)]
        tasks = registry(note=note)
        async with running(driver, tasks, WORKER_CONCURRENCY=4), running(driver, tasks):
            await settled(driver, *ids)

    asyncio.run(main())
    assert sorted(ran, key=int) == [str(i) for i in range(300)]
    assert {job.status for job in driver.jobs.values()} == {JobStatus.COMPLETED}


def test_an_idle_worker_starts_a_new_job_on_its_notification_not_its_next_poll() -> None:
    driver = MemoryDriver()

    async def main() -> float:
        began = asyncio.Event()

        async def mark(payload: dict[str, Any]) -> None:
            began.set()

        loop = asyncio.get_running_loop()
        async with running(driver, registry(mark=mark), WORKER_POLL_MIN=5, WORKER_POLL_MAX=5):
            await asyncio.sleep(0.05)  # idle: the next poll is seconds away
            sent = loop.time()
            driver.enqueue("mark")
            await asyncio.wait_for(began.wait(), 2)
            return loop.time() - sent

    assert asyncio.run(main()) < 1.0


def test_short_jobs_are_claimed_ahead_and_run_in_claim_order() -> None:
    driver = MemoryDriver()
    order: list[int] = []
    seen_ahead: list[int] = []

    async def main() -> None:
        async def quick(payload: dict[str, Any]) -> None:
            order.append(payload["n"])
            seen_ahead.append(len(worker._local.ahead))

        ids = [driver.enqueue("quick", {"n": n}, priority=100 - n) for n in range(40)]
        async with running(driver, registry(quick=quick), WORKER_CONCURRENCY=2) as worker:
            await settled(driver, *ids)

    asyncio.run(main())
    assert order == list(range(40))
    assert max(seen_ahead) > 0  # later claims took more than the free slots
    assert driver.claims < 40  # a claim served several jobs


def test_jobs_claimed_ahead_go_back_when_no_slot_frees_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_queue, "PREFETCH_HOLD", 0.2)
    driver = MemoryDriver()
    states: list[State] = []
    enter = local_queue.LocalQueue._enter

    def noting(self: local_queue.LocalQueue, state: State) -> None:
        enter(self, state)
        states.append(state)

    monkeypatch.setattr(local_queue.LocalQueue, "_enter", noting)

    async def main() -> None:
        release = asyncio.Event()

        async def quick(payload: dict[str, Any]) -> None:
            return None

        async def slow(payload: dict[str, Any]) -> None:
            await release.wait()

        tasks = registry(quick=quick, slow=slow)
        async with running(driver, tasks, WORKER_CONCURRENCY=1) as worker:
            warm = [driver.enqueue("quick") for _ in range(5)]
            await settled(driver, *warm)
            blocker = driver.enqueue("slow", priority=10)
            waiting = [driver.enqueue("quick") for _ in range(3)]
            async with asyncio.timeout(5):
                while not worker._local.ahead:
                    await asyncio.sleep(0.002)
                while worker._local.ahead:  # no slot frees: they go back
                    await asyncio.sleep(0.01)
            assert all(driver.jobs[j].status == JobStatus.PENDING for j in waiting)
            assert all(driver.jobs[j].retry_count == 0 for j in waiting)  # not an attempt
            release.set()
            await settled(driver, blocker, *waiting)

    asyncio.run(main())
    assert State.HANDING_BACK in states
    assert states[-1] == State.STOPPED


def test_a_stop_hands_back_jobs_claimed_ahead_without_counting_an_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_queue, "PREFETCH_HOLD", 30.0)
    driver = MemoryDriver()

    async def main() -> list[str]:
        release = asyncio.Event()

        async def quick(payload: dict[str, Any]) -> None:
            return None

        async def slow(payload: dict[str, Any]) -> None:
            await release.wait()

        tasks = registry(quick=quick, slow=slow)
        async with running(driver, tasks, WORKER_CONCURRENCY=1, WORKER_SHUTDOWN_GRACE=5):
            await settled(driver, *[driver.enqueue("quick") for _ in range(5)])
            driver.enqueue("slow", priority=10)
            waiting = [driver.enqueue("quick") for _ in range(3)]
            async with asyncio.timeout(5):
                while not any(driver.jobs[j].status == JobStatus.PROCESSING for j in waiting):
                    await asyncio.sleep(0.002)
            release.set()
        return waiting

    waiting = asyncio.run(main())
    for job_id in waiting:
        job = driver.jobs[job_id]
        assert job.retry_count == 0
        assert job.status in (JobStatus.PENDING, JobStatus.COMPLETED)
    assert not driver.workers  # deregistered


def test_a_cancel_reaches_a_job_claimed_ahead_which_then_never_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_queue, "PREFETCH_HOLD", 30.0)
    driver = MemoryDriver()
    ran: list[str] = []

    async def main() -> str:
        release = asyncio.Event()

        async def quick(payload: dict[str, Any]) -> None:
            ran.append(payload.get("key", ""))

        async def slow(payload: dict[str, Any]) -> None:
            await release.wait()

        tasks = registry(quick=quick, slow=slow)
        async with running(driver, tasks, WORKER_CONCURRENCY=1) as worker:
            await settled(driver, *[driver.enqueue("quick") for _ in range(5)])
            blocker = driver.enqueue("slow", priority=10)
            victim = driver.enqueue("quick", {"key": "victim"}, priority=5)
            async with asyncio.timeout(5):
                while not any(job.id == victim for job, _ in worker._local.ahead):
                    await asyncio.sleep(0.002)
            driver.cancel(victim)
            async with asyncio.timeout(5):
                while not worker._local.held[victim].is_set():
                    await asyncio.sleep(0.002)
            release.set()
            await settled(driver, blocker, victim)
        return victim

    victim = asyncio.run(main())
    assert driver.jobs[victim].status == JobStatus.CANCELLED
    assert "victim" not in ran


def test_the_claim_loop_waits_out_an_outage_and_loses_no_job() -> None:
    driver = MemoryDriver()

    async def main() -> None:
        async def quick(payload: dict[str, Any]) -> None:
            return None

        async with running(driver, registry(quick=quick)):
            await asyncio.sleep(0.05)
            driver.unreachable = True
            ids = [driver.enqueue("quick") for _ in range(20)]
            await asyncio.sleep(0.3)
            assert all(driver.jobs[j].status == JobStatus.PENDING for j in ids)
            driver.unreachable = False
            await settled(driver, *ids, timeout=10)

    asyncio.run(main())
    assert {job.status for job in driver.jobs.values()} == {JobStatus.COMPLETED}


class SlowOutcomes(MemoryDriver):
    """Outcome writes wait until `written` is set: an outcome still on its way."""

    def __init__(self) -> None:
        super().__init__()
        self.written = asyncio.Event()

    async def record_outcomes(self, *args: Any, **kwargs: Any) -> Any:
        await self.written.wait()
        return await super().record_outcomes(*args, **kwargs)


@pytest.mark.parametrize("failed_claim_meanwhile", [False, True])
def test_a_job_whose_claim_was_lost_is_not_claimed_again_until_its_old_outcome_is_refused(
    failed_claim_meanwhile: bool,
) -> None:
    """A claim lost in a server crash leaves the job pending with its attempt unchanged; were
    the worker to claim it again while the old attempt's outcome is unwritten, that outcome
    would pass the guard and finish the job the new attempt is running. A claim that fails
    meanwhile (the server restarting) makes the worker check what it holds: the job is not
    among them, and its outcome is still on its way."""
    driver = SlowOutcomes()
    runs: list[int] = []

    async def main() -> None:
        async def counted(payload: dict[str, Any]) -> int:
            runs.append(len(runs) + 1)
            if len(runs) == 1:  # the server lost the claim: the row is as before it
                job = driver.jobs[job_id]
                job.status, job.worker_id, job.started_at = JobStatus.PENDING, None, None
            return len(runs)

        async with running(
            driver, registry(counted=counted), WORKER_POLL_MIN=0.01, WORKER_POLL_MAX=0.02
        ):
            await asyncio.sleep(0.1)
            if failed_claim_meanwhile:
                driver.unreachable = True
                await asyncio.sleep(0.1)
                driver.unreachable = False
            await asyncio.sleep(0.3)  # many claims while the first outcome is unwritten
            assert runs == [1]
            driver.written.set()
            await settled(driver, job_id)

    job_id = driver.enqueue("counted")
    asyncio.run(main())
    assert runs == [1, 2]
    assert driver.jobs[job_id].result == 2  # the run after the lost claim, not the first


class LateAnswers(MemoryDriver):
    """Outcome writes that commit at once but whose answer reaches the worker only once
    `answered` is set: the job is due again before its worker knows its outcome is written."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = asyncio.Event()

    async def record_outcomes(self, *args: Any, **kwargs: Any) -> Any:
        answers = await super().record_outcomes(*args, **kwargs)
        await self.answered.wait()
        return answers


class Lines(logging.Handler):
    """The events of the `worker.jobs` lines, in the order they were logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {})
        self.events.append((getattr(record, "event", ""), fields.get("job_id", "")))


def test_a_retried_jobs_next_start_is_logged_after_its_requeue_even_if_due_before_the_answer() -> (
    None
):
    """The retry is due at once, before the worker hears that its outcome was written: the
    worker claims the job again only once it has heard, and logs the requeue first."""
    driver = LateAnswers()
    runs: list[int] = []
    lines, jobs_log = Lines(), logging.getLogger("worker.jobs")
    level = jobs_log.level

    async def main() -> None:
        async def flaky(payload: dict[str, Any]) -> int:
            runs.append(len(runs) + 1)
            if len(runs) == 1:
                raise RuntimeError("the first attempt fails")
            return len(runs)

        async with running(
            driver, registry(flaky=flaky), WORKER_POLL_MIN=0.01, WORKER_POLL_MAX=0.02
        ):
            async with asyncio.timeout(5):
                while driver.jobs[job_id].status != JobStatus.PENDING:  # written, due at once
                    await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)  # many claims while the answer is on its way
            assert runs == [1]
            driver.answered.set()
            await settled(driver, job_id)

    job_id = driver.enqueue("flaky")
    jobs_log.addHandler(lines)
    jobs_log.setLevel(logging.INFO)
    try:
        asyncio.run(main())
    finally:
        jobs_log.removeHandler(lines)
        jobs_log.setLevel(level)
    assert [event for event, job in lines.events if job == job_id] == [
        "job.started",
        "job.requeued",
        "job.started",
        "job.completed",
    ]


def test_the_claim_loop_refuses_a_move_its_state_machine_does_not_name() -> None:
    queue = local_queue.LocalQueue(
        MemoryDriver(),
        None,
        ["default"],
        settings(),
        None,
        lambda: False,
        print,  # type: ignore[arg-type]
    )
    queue._enter(State.CLAIMING)
    queue._enter(State.STOPPED)
    with pytest.raises(AssertionError, match="cannot go from stopped to claiming"):
        queue._enter(State.CLAIMING)
