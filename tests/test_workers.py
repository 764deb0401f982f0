"""Several worker processes, clean stops and dead workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
from support import Processes, counts, query, wait_for

from worker import AsyncClient, Client, JobCancelledError, JobSpec, JobStatus
from worker.daemon import Worker, local_queue
from worker.db.postgres import PostgresDriver
from worker.settings import Settings
from worker.tasks import Task


@pytest.mark.smoke
def test_four_workers_complete_every_job_exactly_once(env, database_url, processes: Processes):
    jobs = [JobSpec("effect", {"key": str(i)}) for i in range(2000)]
    Client(database_url).enqueue_many(jobs)
    for _ in range(4):
        processes.worker(env, "testtasks")
    wait_for(
        lambda: counts(database_url) == {"completed": 2000},
        timeout=180,
        message="2,000 jobs completed",
    )
    runs = query(database_url, "SELECT job, count(*) FROM effects GROUP BY job")
    assert len(runs) == 2000
    assert {n for _, n in runs} == {1}
    workers_used = query(database_url, "SELECT count(DISTINCT worker_id) FROM worker.jobs")
    assert workers_used[0][0] >= 2


def test_sigterm_lets_running_jobs_finish_and_leaves_nothing_processing(
    env, database_url, processes
):
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 1.5}) for i in range(4)]
    proc = processes.worker(env, "testtasks")
    wait_for(lambda: counts(database_url).get("processing") == 4, message="4 jobs running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert counts(database_url) == {"completed": 4}
    assert all(j.refresh().retry_count == 0 for j in jobs)
    assert query(database_url, "SELECT count(*) FROM worker.workers") == [(0,)]


def test_sigterm_hands_back_jobs_that_outlive_the_grace_period(env, database_url, processes):
    client = Client(database_url)
    for i in range(3):
        client.enqueue("effect", {"key": str(i), "sleep": 30})
    proc = processes.worker(env, "testtasks", extra={"WORKER_SHUTDOWN_GRACE": "1"})
    wait_for(lambda: counts(database_url).get("processing") == 3, message="3 jobs running")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 15
    rows = query(database_url, "SELECT status, retry_count, worker_id IS NULL FROM worker.jobs")
    assert {r[0] for r in rows} == {"pending"}
    assert {r[1] for r in rows} == {0}  # a clean stop does not count an attempt
    assert "handing them back" in processes.log(proc)


def test_a_worker_that_cannot_write_outcomes_stops_with_an_error(env, database_url, processes):
    """Not an outage: the database refuses every outcome (here, an operator's trigger). The
    worker must not go on claiming jobs it cannot finish; it stops, saying why, exit code 1."""
    query(
        database_url,
        """
        CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'no job completes today'; END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON worker.jobs FOR EACH ROW
        WHEN (NEW.status = 'completed') EXECUTE FUNCTION refuse();
        """,
    )
    proc = processes.worker(env, "testtasks")
    Client(database_url).enqueue("add", {"a": 1, "b": 2})
    assert proc.wait(timeout=90) == 1
    log = processes.log(proc)
    assert "the worker's completer failed: RaiseException: no job completes today;" in log
    assert "1 job outcomes not written" in log
    assert log.rstrip().endswith(
        "error: the worker's completer failed: RaiseException: no job completes today"
    )
    assert not query(database_url, "SELECT 1 FROM worker.workers"), "it did not deregister"


def test_a_worker_presumed_dead_claims_nothing_until_it_registers_again(
    env, database_url, processes
):
    """A rescuer removes the row of a worker silent for a whole lease (a stall, a partition)
    and hands its jobs to others. A job that worker claimed before its heartbeat registers it
    again would look orphaned at once, and run elsewhere while it runs here."""
    proc = processes.worker(env, "testtasks", extra={"WORKER_LEASE_SECONDS": "30"})
    wait_for(lambda: query(database_url, "SELECT 1 FROM worker.workers"), message="registered")
    query(database_url, "DELETE FROM worker.workers")  # what a rescuer does to a silent worker
    job = Client(database_url).enqueue("add", {"a": 1, "b": 2})  # its NOTIFY wakes the worker
    assert job.wait_sync(timeout=30) == 3  # its next heartbeat registered it again
    assert "was presumed dead by another worker" in processes.log(proc)
    ((registered_again, started),) = query(
        database_url,
        "SELECT w.started_at, j.started_at FROM worker.workers AS w, worker.jobs AS j "
        "WHERE j.id = %s",
        (job.job_id,),
    )
    assert started >= registered_again, "the job was claimed before the worker registered again"


def test_killed_workers_jobs_are_finished_by_another_worker_within_the_lease(
    env, database_url, processes
):
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 6}) for i in range(3)]
    victim = processes.worker(env, "testtasks")
    wait_for(lambda: counts(database_url).get("processing") == 3, message="3 jobs running")
    survivor = processes.worker(env, "testtasks")
    time.sleep(4)  # the survivor must itself have been healthy for a lease before it judges
    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(
        lambda: counts(database_url) == {"completed": 3},
        timeout=60,
        message="the dead worker's jobs completed by the survivor",
    )
    # Lease 3 s (the `env` fixture), a rescue check every lease/4, then the 6 s job again.
    assert time.monotonic() - killed_at < 25
    assert [j.refresh().retry_count for j in jobs] == [1, 1, 1]
    assert query(database_url, "SELECT count(*) FROM effects") == [(3,)]  # killed mid-sleep
    assert "rescued" in processes.log(survivor)


def test_a_live_worker_keeps_its_long_job(env, database_url, processes):
    job = Client(database_url).enqueue("effect", {"key": "long", "sleep": 9})
    processes.worker(env, "testtasks")
    wait_for(lambda: counts(database_url).get("processing") == 1, message="job running")
    processes.worker(env, "testtasks")  # a second worker that could rescue, but must not
    assert job.wait_sync(timeout=60) == "done"
    assert job.retry_count == 0
    assert query(database_url, "SELECT count(*) FROM effects") == [(1,)]


def test_jobs_claimed_ahead_go_back_to_the_queue_when_slots_stay_busy(env, database_url, processes):
    client = Client(database_url)
    one_slot = {"WORKER_CONCURRENCY": "1"}
    first = processes.worker(env, "testtasks", extra=one_slot)
    # Quick jobs: the worker starts claiming a job ahead of its one slot.
    for job in [client.enqueue("add", {"a": i, "b": 0}) for i in range(15)]:
        assert job.wait_sync(timeout=20) == job.refresh().payload["a"]
    # One claim takes both: the long job runs, the quick one waits behind it.
    slow, quick = client.enqueue_many(
        [
            JobSpec("effect", {"key": "slow", "sleep": 6}, priority=10),
            JobSpec("effect", {"key": "quick"}, priority=5),
        ]
    )
    wait_for(lambda: "claimed ahead went back" in processes.log(first), timeout=10)
    processes.worker(env, "testtasks", extra=one_slot)
    assert quick.wait_sync(timeout=10) == "done"
    assert slow.refresh().status == "processing"  # the quick job did not wait for it
    quick_row, slow_row = (
        query(database_url, "SELECT worker_id, retry_count FROM worker.jobs WHERE id = %s", (j,))[0]
        for j in (quick.job_id, slow.job_id)
    )
    assert quick_row[0] != slow_row[0]  # run by the other worker
    assert quick_row[1] == 0  # going back is not an attempt
    assert slow.wait_sync(timeout=20) == "done"


@contextlib.asynccontextmanager
async def one_slot_worker(
    url: str, registry: dict[str, Task]
) -> AsyncIterator[tuple[Worker, AsyncClient]]:
    """A worker of one slot in this process (so a test can look inside it), and a client; the
    test's body has 30 s."""
    worker = Worker(url, Settings(DATABASE_URL=url, WORKER_CONCURRENCY=1), registry=registry)
    running = asyncio.create_task(worker.run())
    client = AsyncClient(url)
    try:
        async with asyncio.timeout(30):
            yield worker, client
    finally:
        worker.request_stop()
        await running
        await client.close()


LISTENING = (
    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'durable-worker-listener' "
    "AND query = 'LISTEN worker_cancel'"
)


def test_a_cancel_heard_before_its_claims_answer_still_stops_the_job(database_url, monkeypatch):
    """A cancel made just after a claim commits notifies every worker at once; the claimer may
    hear it before the claim's own answer arrives, while the job is not its yet."""
    ran: list[str] = []
    claim_answered = PostgresDriver.claim

    async def cancelled_in_flight(driver, spec, limit, running):  # type: ignore[no-untyped-def]
        rows = await claim_answered(driver, spec, limit, running)
        if rows:
            # Committed: the cancel can only ask the worker now, over NOTIFY, which the
            # listener hears before this answer is handed on.
            assert Client(database_url).cancel(rows[0].id) == JobStatus.PROCESSING
            await asyncio.sleep(1.0)
        return rows

    monkeypatch.setattr(PostgresDriver, "claim", cancelled_in_flight)

    async def main() -> None:
        async def quick(payload: dict[str, object]) -> None:
            ran.append("victim")

        registry = {"quick": Task("quick", quick, is_async=True)}
        async with one_slot_worker(database_url, registry) as (_, client):
            while not query(database_url, LISTENING):
                await asyncio.sleep(0.01)
            victim = await client.enqueue("quick", {})
            with pytest.raises(JobCancelledError):
                await victim.wait()

    asyncio.run(main())
    assert ran == []


def test_job_cancelled_while_claimed_ahead_never_runs(database_url, monkeypatch):
    # In one process, so that the test decides when the one slot frees; the job claimed ahead
    # is held long enough for a loaded machine.
    monkeypatch.setattr(local_queue, "PREFETCH_HOLD", 10.0)
    ran: list[str] = []

    async def main() -> None:
        release = asyncio.Event()

        async def slow(payload: dict[str, object]) -> None:
            await release.wait()

        async def quick(payload: dict[str, object]) -> None:
            ran.append(str(payload["key"]))

        registry = {
            "slow": Task("slow", slow, is_async=True),
            "quick": Task("quick", quick, is_async=True),
        }
        async with one_slot_worker(database_url, registry) as (worker, client):
            for i in range(3):  # quick jobs: the worker starts claiming a job ahead
                await (await client.enqueue("quick", {"key": f"warm-up {i}"})).wait()
            blocker, victim = await client.enqueue_many(
                [
                    JobSpec("slow", priority=10),
                    JobSpec("quick", {"key": "victim"}, priority=5),
                ]
            )
            while not any(str(job.id) == victim.job_id for job, _ in worker._local.ahead):
                await asyncio.sleep(0.002)
            # Claimed, so the request is all a cancel can do; the worker hears of it.
            assert await client.cancel(victim.job_id) == JobStatus.PROCESSING
            while not worker._local.held[victim.job_id].is_set():
                await asyncio.sleep(0.002)
            release.set()
            await blocker.wait()
            with pytest.raises(JobCancelledError):
                await victim.wait()

    asyncio.run(main())
    assert ran == [f"warm-up {i}" for i in range(3)]


# -- burst ---------------------------------------------------------------------------------


def test_burst_drains_the_due_jobs_and_exits_0_leaving_jobs_due_later(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    jobs = [client.enqueue("add", {"a": n, "b": 1}) for n in range(30)]
    later = client.enqueue("add", {"a": 0, "b": 0}, delay=3600)
    proc = processes.worker(env, "testtasks", args=("--burst",))
    assert proc.wait(timeout=120) == 0, processes.log(proc)
    assert [job.refresh().status for job in jobs] == [JobStatus.COMPLETED] * len(jobs)
    assert [job.result for job in jobs] == [n + 1 for n in range(30)]
    assert later.refresh().status == JobStatus.PENDING
    assert "no due job left in its queues (burst)" in processes.log(proc)
    assert query(database_url, "SELECT count(*) FROM worker.workers") == [(0,)]


def test_burst_on_an_empty_queue_exits_0_at_once(env, processes: Processes):
    proc = processes.worker(env, "testtasks", args=("--burst",))
    started = time.monotonic()
    assert proc.wait(timeout=60) == 0, processes.log(proc)
    # Idle polling backs off to WORKER_POLL_MAX: a worker waiting for work would still run.
    assert time.monotonic() - started < 30


def test_burst_waits_for_its_own_running_jobs_to_end(env, database_url, processes: Processes):
    client = Client(database_url)
    slow = client.enqueue("counted", {"second_sleep": 1})
    proc = processes.worker(env, "testtasks", args=("--burst",))
    assert proc.wait(timeout=120) == 0, processes.log(proc)
    assert slow.refresh().status == JobStatus.COMPLETED
