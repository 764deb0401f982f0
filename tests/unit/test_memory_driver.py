"""The in-memory driver keeps the guarantees of the statements it stands in for."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from worker.db.driver import (
    LOCKED,
    ClaimSpec,
    OutcomeWrite,
    RecordedOutcome,
    Registration,
    RetryPolicy,
    StageWrite,
)
from worker.db.errors import Unsupported
from worker.db.memory import MemoryDriver
from worker.models import JobStatus, Outcome, OutcomeKind

POLICY = RetryPolicy(backoff_base=0.0, backoff_max=0.0)


def spec(worker_id: uuid.UUID, tasks: tuple[str, ...] = ("t",)) -> ClaimSpec:
    return ClaimSpec(worker_id, ["default"], list(tasks), 3, [], [])


async def registered(driver: MemoryDriver, tasks: tuple[str, ...] = ("t",)) -> uuid.UUID:
    worker_id = uuid.uuid4()
    registration = Registration(worker_id, "here", 1, ["default"], 1, list(tasks), 15.0)
    await driver.register_worker(registration)
    return worker_id


def test_a_pending_job_is_claimed_by_one_worker_only() -> None:
    driver = MemoryDriver()

    async def main() -> tuple[int, int]:
        first, second = await registered(driver), await registered(driver)
        for _ in range(5):
            driver.enqueue("t")
        a = await driver.claim(spec(first), 3, [])
        b = await driver.claim(spec(second), 10, [])
        assert not {j.id for j in a} & {j.id for j in b}
        return len(a), len(b)

    assert asyncio.run(main()) == (3, 2)


def test_a_worker_whose_registration_is_gone_claims_nothing() -> None:
    driver = MemoryDriver()

    async def main() -> int:
        driver.enqueue("t")
        return len(await driver.claim(spec(uuid.uuid4()), 10, []))

    assert asyncio.run(main()) == 0


def test_an_outcome_applies_only_to_the_attempt_that_holds_the_job() -> None:
    driver = MemoryDriver()

    async def main() -> list[object]:
        worker_id = await registered(driver)
        job_id = driver.enqueue("t")
        [job] = await driver.claim(spec(worker_id), 1, [])
        done = Outcome(OutcomeKind.COMPLETED, result=1)
        stale = OutcomeWrite(job_id, job.retry_count + 1, done, 3)  # another attempt's
        other = await driver.record_outcomes(
            uuid.uuid4(), POLICY, [OutcomeWrite(job_id, 0, done, 3)]
        )
        late = await driver.record_outcomes(worker_id, POLICY, [stale])
        ours = await driver.record_outcomes(worker_id, POLICY, [OutcomeWrite(job_id, 0, done, 3)])
        return [other, late, ours]

    other, late, ours = asyncio.run(main())
    assert other == [None] and late == [None]
    [recorded] = ours  # type: ignore[misc]
    assert isinstance(recorded, RecordedOutcome) and recorded.status == JobStatus.COMPLETED


def test_a_write_on_a_locked_row_is_skipped_and_stays_ours() -> None:
    driver = MemoryDriver()

    async def main() -> tuple[list[object], list[object], str]:
        worker_id = await registered(driver)
        job_id = driver.enqueue("t")
        await driver.claim(spec(worker_id), 1, [])
        driver.locked.add(job_id)
        stage = await driver.write_stages(worker_id, [StageWrite(job_id, 0, started="s")])
        write = OutcomeWrite(job_id, 0, Outcome(OutcomeKind.COMPLETED), 3)
        outcome = await driver.record_outcomes(worker_id, POLICY, [write])
        return list(stage), list(outcome), driver.jobs[job_id].status

    assert asyncio.run(main()) == ([LOCKED], [LOCKED], JobStatus.PROCESSING)


def test_a_silent_workers_job_is_rescued_counting_the_lost_attempt() -> None:
    driver = MemoryDriver()

    async def main() -> tuple[int, str, int]:
        worker_id = await registered(driver)
        job_id = driver.enqueue("t")
        await driver.claim(spec(worker_id), 1, [])
        driver.workers[worker_id].heartbeat_at -= 60
        rescued = await driver.rescue(15.0, 1.0, lambda: True)
        job = driver.jobs[job_id]
        return len(rescued), job.status, job.retry_count

    assert asyncio.run(main()) == (1, JobStatus.PENDING, 1)


def test_a_snoozed_job_due_again_is_claimed_before_new_work() -> None:
    driver = MemoryDriver()

    async def main() -> list[str]:
        worker_id = await registered(driver, ("watch", "new"))
        snoozing = driver.enqueue("watch")
        await driver.claim(spec(worker_id, ("watch", "new")), 1, [])
        waiting = [driver.enqueue("new") for _ in range(3)]
        snooze = Outcome(OutcomeKind.SNOOZED, delay=0.0)
        await driver.record_outcomes(worker_id, POLICY, [OutcomeWrite(snoozing, 0, snooze, 3)])
        claimed = await driver.claim(spec(worker_id, ("watch", "new")), 2, [])
        assert {j.id for j in claimed} <= {snoozing, *waiting}
        return [j.id for j in claimed]

    first, second = asyncio.run(main())
    assert driver.jobs[first].task == "watch" and driver.jobs[second].task == "new"


def test_a_worker_claims_only_the_tasks_it_registered() -> None:
    """As `sql.CLAIM`: a job of a task the worker lacks waits for one that has it, even one
    that only settles (its cancel was asked: the claimer runs its cleanups)."""
    driver = MemoryDriver()

    async def main() -> tuple[set[str], set[str], JobStatus, set[str], set[str]]:
        old = await registered(driver, ("resize",))
        new = await registered(driver, ("resize", "thumbnail"))
        resize = driver.enqueue("resize")
        thumbnail = driver.enqueue("thumbnail")
        settling = driver.enqueue("thumbnail")
        driver.jobs[settling].cancel_requested = True
        by_old = {j.id for j in await driver.claim(spec(old, ("resize",)), 10, [])}
        left = driver.jobs[thumbnail].status
        by_new = {j.id for j in await driver.claim(spec(new, ("resize", "thumbnail")), 10, [])}
        return by_old, {resize}, left, by_new, {thumbnail, settling}

    by_old, resizes, left, by_new, thumbnails = asyncio.run(main())
    assert by_old == resizes and left == JobStatus.PENDING
    assert by_new == thumbnails


def test_a_job_with_a_concurrency_key_is_refused_not_run_unlimited() -> None:
    driver = MemoryDriver()
    with pytest.raises(Unsupported, match="concurrency_key='tenant-1' needs PostgreSQL"):
        driver.enqueue("t", concurrency_key="tenant-1")
    assert driver.jobs == {}


def test_a_queue_limit_is_refused_not_ignored() -> None:
    driver = MemoryDriver()
    with pytest.raises(Unsupported, match="queue limits: queue 'emails'"):
        driver.limit_queue("emails", concurrency=2)


def test_a_paused_queue_gives_no_job_until_it_is_resumed() -> None:
    driver = MemoryDriver()
    heard: list[str | None] = []

    async def main() -> tuple[int, int]:
        worker_id = await registered(driver)
        driver.subscribe("worker_jobs", heard.append)
        driver.enqueue("t")
        driver.pause_queue("default")
        while_paused = len(await driver.claim(spec(worker_id), 10, []))
        driver.resume_queue("default")
        return while_paused, len(await driver.claim(spec(worker_id), 10, []))

    assert asyncio.run(main()) == (0, 1)
    assert heard.count("default") == 2  # the enqueue and the resume wake the claimers
