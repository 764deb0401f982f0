"""One suite of the driver seam, run against every driver: PostgreSQL is the reference.

Each `test_*` here takes a `harness` fixture: a driver with the few outside moves a test needs
(enqueue a job, read its row, silence a worker, pause a queue, cancel). The test modules that
import this suite provide that fixture: `tests/unit/test_memory_conformance.py` the in-memory
driver (in the fast tier), `tests/test_driver_conformance.py` `PostgresDriver` on a migrated
database. A test that passes on one and fails on the other is a difference between the drivers,
and the in-memory one is what changes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from support.db import query
from support.factories import insert_job
from worker.db import sql
from worker.db.driver import ClaimSpec, Driver, OutcomeWrite, Registration, RetryPolicy, StageWrite
from worker.db.memory import MemoryDriver
from worker.db.postgres import PostgresDriver
from worker.models import JobStatus, Outcome, OutcomeKind, StageKind, StageStatus

T = TypeVar("T")

NO_BACKOFF = RetryPolicy(backoff_base=0.0, backoff_max=0.0)


class Harness(Protocol):
    """A driver, and what a test does to its jobs from outside the seam."""

    driver: Driver

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        """Open the driver, run `main` on a fresh event loop, close the driver."""

    def enqueue(
        self, task: str, *, queue: str = "default", priority: int = 0, delay: float = 0.0
    ) -> str: ...

    def row(self, job_id: str) -> tuple[JobStatus, int, str | None]:
        """The job's status, retry count and error."""

    def due_in(self, job_id: str) -> float:
        """Seconds until the job is due (negative once it is)."""

    def silence(self, worker_id: uuid.UUID, seconds: float) -> None:
        """Move the worker's last heartbeat `seconds` into the past."""

    def pause(self, queue: str) -> None: ...

    def resume(self, queue: str) -> None: ...

    def cancel(self, job_id: str) -> None: ...


class MemoryHarness:
    def __init__(self) -> None:
        self.memory = MemoryDriver()
        self.driver: Driver = self.memory

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        return asyncio.run(_opened(self.driver, main))

    def enqueue(
        self, task: str, *, queue: str = "default", priority: int = 0, delay: float = 0.0
    ) -> str:
        return self.memory.enqueue(task, queue=queue, priority=priority, delay=delay)

    def row(self, job_id: str) -> tuple[JobStatus, int, str | None]:
        job = self.memory.jobs[job_id]
        return job.status, job.retry_count, job.error

    def due_in(self, job_id: str) -> float:
        return self.memory.jobs[job_id].run_at - time.monotonic()

    def silence(self, worker_id: uuid.UUID, seconds: float) -> None:
        self.memory.workers[worker_id].heartbeat_at -= seconds

    def pause(self, queue: str) -> None:
        self.memory.pause_queue(queue)

    def resume(self, queue: str) -> None:
        self.memory.resume_queue(queue)

    def cancel(self, job_id: str) -> None:
        self.memory.cancel(job_id)


class PostgresHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.driver: Driver = PostgresDriver(url)

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        return asyncio.run(_opened(self.driver, main))

    def enqueue(
        self, task: str, *, queue: str = "default", priority: int = 0, delay: float = 0.0
    ) -> str:
        run_at = datetime.now(UTC) + timedelta(seconds=delay)
        return insert_job(self.url, task, queue=queue, priority=priority, run_at=run_at)

    def row(self, job_id: str) -> tuple[JobStatus, int, str | None]:
        [(status, retries, error)] = query(
            self.url, "SELECT status, retry_count, error FROM worker.jobs WHERE id = %s", (job_id,)
        )
        return JobStatus(status), retries, error

    def due_in(self, job_id: str) -> float:
        statement = "SELECT extract(epoch FROM run_at - now()) FROM worker.jobs WHERE id = %s"
        return float(query(self.url, statement, (job_id,))[0][0])

    def silence(self, worker_id: uuid.UUID, seconds: float) -> None:
        query(
            self.url,
            "UPDATE worker.workers SET heartbeat_at = heartbeat_at - make_interval(secs => %s)"
            " WHERE id = %s",
            (seconds, worker_id),
        )

    def pause(self, queue: str) -> None:
        query(self.url, sql.PAUSE_QUEUE, {"name": queue})

    def resume(self, queue: str) -> None:
        query(self.url, sql.RESUME_QUEUE, {"name": queue})

    def cancel(self, job_id: str) -> None:
        query(self.url, sql.CANCEL, {"id": job_id})


async def _opened(driver: Driver, main: Callable[[], Awaitable[T]]) -> T:
    await driver.open()
    try:
        return await main()
    finally:
        await driver.close()


def spec(
    worker_id: uuid.UUID, tasks: tuple[str, ...] = ("t",), queue: str = "default"
) -> ClaimSpec:
    return ClaimSpec(worker_id, [queue], list(tasks), 3, [], [])


async def registered(
    harness: Harness, tasks: tuple[str, ...] = ("t",), queue: str = "default"
) -> uuid.UUID:
    worker_id = uuid.uuid4()
    registration = Registration(worker_id, "here", 1, [queue], 4, list(tasks), 15.0)
    await harness.driver.register_worker(registration)
    return worker_id


async def claimed_one(harness: Harness, tasks: tuple[str, ...] = ("t",)) -> tuple[uuid.UUID, str]:
    """A registered worker holding one job of task `tasks[0]`: its id and the job's."""
    worker_id = await registered(harness, tasks)
    job_id = harness.enqueue(tasks[0])
    [job] = await harness.driver.claim(spec(worker_id, tasks), 1, [])
    assert job.id == job_id
    return worker_id, job_id


async def record(
    harness: Harness, worker_id: uuid.UUID, job_id: str, outcome: Outcome, **options: Any
) -> Any:
    write = OutcomeWrite(job_id, options.get("retries", 0), outcome, options.get("limit", 3))
    policy = options.get("policy", NO_BACKOFF)
    [answer] = await harness.driver.record_outcomes(worker_id, policy, [write])
    return answer


# -- claims ----------------------------------------------------------------------------------


def test_a_pending_job_is_claimed_by_one_worker_only(harness: Harness) -> None:
    async def main() -> tuple[set[str], set[str]]:
        first, second = await registered(harness), await registered(harness)
        for _ in range(5):
            harness.enqueue("t")
        a = await harness.driver.claim(spec(first), 3, [])
        b = await harness.driver.claim(spec(second), 10, [])
        return {j.id for j in a}, {j.id for j in b}

    a, b = harness.run(main)
    assert (len(a), len(b)) == (3, 2) and not a & b


def test_the_highest_priority_is_claimed_first(harness: Harness) -> None:
    async def main() -> tuple[list[str], list[str]]:
        worker_id = await registered(harness)
        ids = [harness.enqueue("t", priority=p) for p in (0, 5, 1)]
        order = []
        for _ in ids:
            [job] = await harness.driver.claim(spec(worker_id), 1, [])
            order.append(job.id)
        return order, [ids[1], ids[2], ids[0]]

    order, expected = harness.run(main)
    assert order == expected


def test_a_job_already_started_is_claimed_before_new_work_of_its_priority(
    harness: Harness,
) -> None:
    async def main() -> tuple[str, str]:
        worker_id, snoozing = await claimed_one(harness)
        for _ in range(3):
            harness.enqueue("t")  # due before the snoozed job is due again
        await record(harness, worker_id, snoozing, Outcome(OutcomeKind.SNOOZED, delay=0.0))
        [job] = await harness.driver.claim(spec(worker_id), 1, [])
        return job.id, snoozing

    claimed, snoozing = harness.run(main)
    assert claimed == snoozing


def test_a_job_due_in_the_future_is_not_claimed(harness: Harness) -> None:
    async def main() -> list[str]:
        worker_id = await registered(harness)
        harness.enqueue("t", delay=3600)
        return [j.id for j in await harness.driver.claim(spec(worker_id), 10, [])]

    assert harness.run(main) == []


def test_a_worker_claims_only_the_tasks_it_registered(harness: Harness) -> None:
    async def main() -> tuple[set[str], str, JobStatus]:
        worker_id = await registered(harness, ("resize",))
        resize = harness.enqueue("resize")
        thumbnail = harness.enqueue("thumbnail")
        got = {j.id for j in await harness.driver.claim(spec(worker_id, ("resize",)), 10, [])}
        return got, resize, harness.row(thumbnail)[0]

    got, resize, left = harness.run(main)
    assert got == {resize} and left == JobStatus.PENDING


def test_a_worker_whose_registration_is_gone_claims_nothing(harness: Harness) -> None:
    async def main() -> list[str]:
        harness.enqueue("t")
        return [j.id for j in await harness.driver.claim(spec(uuid.uuid4()), 10, [])]

    assert harness.run(main) == []


def test_a_paused_queue_gives_no_job_until_it_is_resumed(harness: Harness) -> None:
    async def main() -> tuple[int, int]:
        worker_id = await registered(harness)
        harness.enqueue("t")
        harness.pause("default")
        while_paused = len(await harness.driver.claim(spec(worker_id), 10, []))
        harness.resume("default")
        return while_paused, len(await harness.driver.claim(spec(worker_id), 10, []))

    assert harness.run(main) == (0, 1)


def test_a_released_job_is_pending_again_without_counting_an_attempt(harness: Harness) -> None:
    async def main() -> tuple[tuple[JobStatus, int, str | None], set[str]]:
        worker_id, job_id = await claimed_one(harness)
        await harness.driver.release(worker_id, [job_id])
        return harness.row(job_id), await harness.driver.held_jobs(worker_id)

    (status, retries, _), held = harness.run(main)
    assert (status, retries, held) == (JobStatus.PENDING, 0, set())


# -- outcomes --------------------------------------------------------------------------------


def test_a_completed_outcome_finishes_the_job(harness: Harness) -> None:
    async def main() -> tuple[Any, JobStatus]:
        worker_id, job_id = await claimed_one(harness)
        answer = await record(harness, worker_id, job_id, Outcome(OutcomeKind.COMPLETED, result=1))
        return answer, harness.row(job_id)[0]

    answer, status = harness.run(main)
    assert answer.status == status == JobStatus.COMPLETED and answer.retry_count == 0


def test_a_retry_waits_for_the_workers_backoff_and_counts_the_attempt(harness: Harness) -> None:
    policy = RetryPolicy(backoff_base=60.0, backoff_max=600.0)

    async def main() -> tuple[tuple[JobStatus, int, str | None], float]:
        worker_id, job_id = await claimed_one(harness)
        retry = Outcome(OutcomeKind.RETRY, error="boom")
        await record(harness, worker_id, job_id, retry, policy=policy)
        return harness.row(job_id), harness.due_in(job_id)

    row, due_in = harness.run(main)
    assert row == (JobStatus.PENDING, 1, "boom")
    assert 25 < due_in <= 60  # the base, less up to half of it in jitter


def test_a_retry_with_no_retries_left_fails_the_job(harness: Harness) -> None:
    async def main() -> tuple[JobStatus, int, str | None]:
        worker_id, job_id = await claimed_one(harness)
        await record(harness, worker_id, job_id, Outcome(OutcomeKind.RETRY, error="x"), limit=0)
        return harness.row(job_id)

    assert harness.run(main) == (JobStatus.FAILED, 0, "x")


def test_a_failed_outcome_fails_the_job_for_good(harness: Harness) -> None:
    async def main() -> tuple[JobStatus, int, str | None]:
        worker_id, job_id = await claimed_one(harness)
        await record(harness, worker_id, job_id, Outcome(OutcomeKind.FAILED, error="bad"))
        return harness.row(job_id)

    assert harness.run(main) == (JobStatus.FAILED, 0, "bad")


def test_a_snoozed_job_waits_without_counting_an_attempt(harness: Harness) -> None:
    async def main() -> tuple[tuple[JobStatus, int, str | None], float]:
        worker_id, job_id = await claimed_one(harness)
        await record(harness, worker_id, job_id, Outcome(OutcomeKind.SNOOZED, delay=120.0))
        return harness.row(job_id), harness.due_in(job_id)

    row, due_in = harness.run(main)
    assert row == (JobStatus.PENDING, 0, None) and 110 < due_in <= 120


def test_an_outcome_applies_only_to_the_attempt_that_holds_the_job(harness: Harness) -> None:
    async def main() -> tuple[Any, Any, JobStatus]:
        worker_id, job_id = await claimed_one(harness)
        done = Outcome(OutcomeKind.COMPLETED)
        stranger = await record(harness, uuid.uuid4(), job_id, done)
        stale = await record(harness, worker_id, job_id, done, retries=1)
        return stranger, stale, harness.row(job_id)[0]

    assert harness.run(main) == (None, None, JobStatus.PROCESSING)


# -- stages ----------------------------------------------------------------------------------


def test_stage_writes_are_read_back_in_the_order_they_ran(harness: Harness) -> None:
    async def main() -> list[tuple[str, StageStatus, Any, int]]:
        worker_id, job_id = await claimed_one(harness)
        writes = [
            StageWrite(job_id, 0, started="fetch", kind=StageKind.STAGE, attempt=1),
            StageWrite(job_id, 0, ended="fetch", output='{"n": 2}', started="store", attempt=1),
        ]
        for write in writes:
            [answer] = await harness.driver.write_stages(worker_id, [write])
            assert isinstance(answer, float)
        history = await harness.driver.load_stages(job_id)
        return [(r.stage, r.status, r.output, r.attempt) for r in history.rows]

    assert harness.run(main) == [
        ("fetch", StageStatus.COMPLETED, {"n": 2}, 1),
        ("store", StageStatus.RUNNING, None, 1),
    ]


def test_a_stage_write_of_another_attempt_is_not_written(harness: Harness) -> None:
    async def main() -> tuple[list[Any], int]:
        worker_id, job_id = await claimed_one(harness)
        answers = await harness.driver.write_stages(
            worker_id, [StageWrite(job_id, 1, started="fetch", attempt=2)]
        )
        return list(answers), len((await harness.driver.load_stages(job_id)).rows)

    assert harness.run(main) == ([None], 0)


# -- liveness and cancels --------------------------------------------------------------------


def test_a_silent_workers_job_is_rescued_counting_the_lost_attempt(harness: Harness) -> None:
    async def main() -> tuple[list[str], tuple[JobStatus, int, str | None], str]:
        worker_id, job_id = await claimed_one(harness)
        harness.silence(worker_id, 60)
        rescued = await harness.driver.rescue(15.0, 1.0, lambda: True)
        return [r.id for r in rescued], harness.row(job_id), job_id

    rescued, (status, retries, error), job_id = harness.run(main)
    assert rescued == [job_id] and (status, retries) == (JobStatus.PENDING, 1)
    assert error == "the worker running this job was lost (no heartbeat for 15 s)"


def test_a_beating_workers_job_is_not_rescued(harness: Harness) -> None:
    async def main() -> tuple[list[Any], JobStatus]:
        _, job_id = await claimed_one(harness)
        return await harness.driver.rescue(15.0, 1.0, lambda: True), harness.row(job_id)[0]

    assert harness.run(main) == ([], JobStatus.PROCESSING)


def test_a_pending_job_cancelled_is_cancelled_at_once(harness: Harness) -> None:
    async def main() -> tuple[JobStatus, int, str | None]:
        job_id = harness.enqueue("t")
        harness.cancel(job_id)
        return harness.row(job_id)

    assert harness.run(main) == (JobStatus.CANCELLED, 0, None)


def test_a_running_jobs_cancel_reaches_its_worker_at_the_next_heartbeat(harness: Harness) -> None:
    async def main() -> tuple[list[str], str, JobStatus]:
        worker_id = uuid.uuid4()
        registration = Registration(worker_id, "here", 1, ["default"], 4, ["t"], 15.0)
        await harness.driver.register_worker(registration)
        job_id = harness.enqueue("t")
        await harness.driver.claim(spec(worker_id), 1, [])
        harness.cancel(job_id)
        beat = await harness.driver.heartbeat(registration)
        return beat.cancel_requested, job_id, harness.row(job_id)[0]

    requested, job_id, status = harness.run(main)
    assert requested == [job_id] and status == JobStatus.PROCESSING
