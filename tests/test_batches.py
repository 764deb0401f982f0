"""Batches with callbacks (`enqueue_many(..., on_complete=..., on_failure=...)`), run by real
`worker run` processes against a real PostgreSQL: each callback runs once, after the last
job's outcome is committed, and reads the batch's outcomes counted."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import psycopg
import pytest
from batchtasks import GATE
from support import Processes, query, wait_for
from support.statements import statements_of

from worker import AsyncClient, BatchJobs, Client, InvalidJob, JobSpec, JobStatus, Workflow
from worker.client import MAX_BATCH_JOBS

# Gated rounds of the race between a batch's last jobs, each `WIDTH` jobs let go at once.
ROUNDS = 100
WIDTH = 20
NOT_NEEDED = "cancelled: not needed, every parent completed"


def _row(url: str, job_id: str) -> tuple[str, str | None, Any]:
    (row,) = query(url, "SELECT status, error, result FROM worker.jobs WHERE id = %s", (job_id,))
    return row[0], row[1], row[2]


def _runs(url: str, job_id: str) -> list[str]:
    rows = query(url, "SELECT kind FROM effects WHERE job = %s ORDER BY at", (job_id,))
    return [str(r[0]) for r in rows]


def _written(url: str) -> tuple[int, int, int]:
    """How many jobs, workflows and edges the database holds."""
    (row,) = query(
        url,
        "SELECT (SELECT count(*) FROM worker.jobs), (SELECT count(*) FROM worker.workflows), "
        "(SELECT count(*) FROM worker.job_dependencies)",
    )
    return int(row[0]), int(row[1]), int(row[2])


def _ended(url: str, *job_ids: str) -> bool:
    return all(_row(url, j)[0] in ("completed", "failed", "cancelled") for j in job_ids)


def _at_gate(url: str) -> int:
    """How many jobs wait at the gate: each a running job blocked on its shared lock."""
    return int(
        query(
            url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND objid = %s AND NOT granted",
            (GATE,),
        )[0][0]
    )


def test_each_callback_runs_once_when_the_last_jobs_end_together_across_two_workers(
    env, database_url, processes: Processes
):
    """Every round, a batch's jobs all run, wait at a gate and are let go at once across two
    worker processes; one job of every other round fails. `on_complete` runs exactly once,
    after every outcome is committed; `on_failure` runs exactly once when a job failed, and
    never when none did."""
    client = Client(database_url)
    for _ in range(2):
        processes.worker(env, "batchtasks", extra={"WORKER_CONCURRENCY": str(WIDTH // 2)})
    with psycopg.connect(database_url, autocommit=True) as lock:
        for round_ in range(ROUNDS):
            failing = round_ % 2 == 1
            specs = [
                JobSpec("item", {"n": n, "gate": True, "fail": failing and n == 0}, max_retries=0)
                for n in range(WIDTH)
            ]
            lock.execute("SELECT pg_advisory_lock(%s)", (GATE,))
            jobs = client.enqueue_many(specs, on_complete="summarize", on_failure="summarize")
            wait_for(lambda: _at_gate(database_url) == WIDTH, message=f"{WIDTH} jobs at the gate")
            lock.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
            assert jobs.on_complete is not None and jobs.on_failure is not None
            done, fallback = jobs.on_complete.job_id, jobs.on_failure.job_id
            wait_for(
                partial(_ended, database_url, done, fallback),
                message=f"round {round_}: both callbacks ended",
            )
            counts = {"completed": WIDTH - failing, "failed": int(failing)}
            counts |= {"cancelled": 0, "deleted": 0}
            assert _row(database_url, done) == ("completed", None, counts), round_
            assert _runs(database_url, done) == ["ran:0"], round_
            if failing:
                assert _row(database_url, fallback) == ("completed", None, counts), round_
                assert _runs(database_url, fallback) == ["ran:0"], round_
            else:
                assert _row(database_url, fallback)[:2] == ("cancelled", NOT_NEEDED), round_
                assert _runs(database_url, fallback) == [], round_


def test_callbacks_read_the_batch_outcomes_counted(env, database_url, processes: Processes):
    client = Client(database_url)
    specs = [JobSpec("item", {"n": n}) for n in range(3)]
    specs += [JobSpec("item", {"n": n, "fail": True}, max_retries=0) for n in range(3, 5)]
    specs += [JobSpec("item", {"n": n}, delay=3600) for n in range(5, 8)]
    jobs = client.enqueue_many(specs, on_complete="summarize", on_failure="summarize")
    # Two are cancelled and one is deleted before they ever ran.
    for job in jobs[5:7]:
        assert client.cancel(job.job_id) == JobStatus.CANCELLED
    query(database_url, "DELETE FROM worker.jobs WHERE id = %s", (jobs[7].job_id,))
    processes.worker(env, "batchtasks")
    assert jobs.on_complete is not None and jobs.on_failure is not None
    jobs.on_complete.wait_sync(timeout=30)
    jobs.on_failure.wait_sync(timeout=30)
    counts = {"completed": 3, "failed": 2, "cancelled": 2, "deleted": 1}
    assert _row(database_url, jobs.on_complete.job_id)[2] == counts
    assert _row(database_url, jobs.on_failure.job_id)[2] == counts


def test_on_failure_is_cancelled_as_not_needed_when_every_job_completed(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    jobs = client.enqueue_many(
        [("item", {"n": n}) for n in range(5)], on_complete="summarize", on_failure="summarize"
    )
    processes.worker(env, "batchtasks")
    assert jobs.on_complete is not None and jobs.on_failure is not None
    result = jobs.on_complete.wait_sync(timeout=30)
    assert result == {"completed": 5, "failed": 0, "cancelled": 0, "deleted": 0}
    wait_for(partial(_ended, database_url, jobs.on_failure.job_id), message="on_failure ended")
    assert _row(database_url, jobs.on_failure.job_id)[:2] == ("cancelled", NOT_NEEDED)
    assert _runs(database_url, jobs.on_failure.job_id) == []


def test_a_batch_is_a_workflow_whose_callbacks_wait_for_every_job(database_url):
    client = Client(database_url)
    jobs = client.enqueue_many(
        [("item", {"n": n}) for n in range(3)], on_complete="summarize", on_failure="summarize"
    )
    assert isinstance(jobs, BatchJobs) and isinstance(jobs, list) and len(jobs) == 3
    assert list(jobs.workflow.jobs) == ["0", "1", "2", "on_complete", "on_failure"]
    assert jobs.workflow.jobs["on_complete"] is jobs.on_complete
    # Read back anywhere, it is the same workflow.
    handle = Workflow.get(jobs.workflow.id, client=client)
    assert handle.name == "batch"
    assert list(handle.jobs) == ["0", "1", "2", "on_complete", "on_failure"]
    assert handle.parents["on_complete"] == handle.parents["on_failure"] == ["0", "1", "2"]
    assert [j.job_id for j in jobs] == [handle.jobs[str(n)].job_id for n in range(3)]
    assert handle.status()[JobStatus.HELD] == 2
    # Cancelling the batch cancels its jobs; both callbacks then run, told so.
    assert jobs.workflow.cancel() == 3
    assert handle.status()[JobStatus.PENDING] == 2


def test_the_async_client_enqueues_a_batch_with_callbacks(database_url):
    async def main() -> BatchJobs:
        client = AsyncClient(database_url)
        try:
            return await client.enqueue_many(
                [("item", {"n": n}) for n in range(4)], on_failure="summarize"
            )
        finally:
            await client.close()

    jobs = asyncio.run(main())
    assert len(jobs) == 4 and jobs.on_complete is None and jobs.on_failure is not None
    assert list(jobs.workflow.jobs) == ["0", "1", "2", "3", "on_failure"]
    assert _row(database_url, jobs.on_failure.job_id)[0] == "held"
    assert _written(database_url) == (5, 1, 4)


def test_a_wide_batch_is_one_statement_and_releases_its_callback_with_every_count(
    env, database_url, processes: Processes, monkeypatch
):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    jobs = client.enqueue_many(
        [("item", {"n": n}) for n in range(MAX_BATCH_JOBS)], on_complete="summarize"
    )
    monkeypatch.undo()
    assert len(sent) == 1 and "worker.enqueue_workflow" in sent[0]
    assert _written(database_url) == (MAX_BATCH_JOBS + 1, 1, MAX_BATCH_JOBS)
    # Every job ends in one statement; the callback is released by it, and reads them all.
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', finished_at = now() "
        "WHERE workflow_id = %s AND node <> 'on_complete'",
        (jobs.workflow.id,),
    )
    processes.worker(env, "batchtasks")
    assert jobs.on_complete is not None
    result = jobs.on_complete.wait_sync(timeout=60)
    assert result == {"completed": MAX_BATCH_JOBS, "failed": 0, "cancelled": 0, "deleted": 0}


def test_a_batch_in_a_transaction_that_rolls_back_writes_nothing(database_url):
    client = Client(database_url)
    with psycopg.connect(database_url) as conn:
        client.enqueue_many([("item", {"n": 1})], on_complete="summarize", connection=conn)
        conn.rollback()
        assert _written(database_url) == (0, 0, 0)
        jobs = client.enqueue_many([("item", {"n": 1})], on_complete="summarize", connection=conn)
        assert _written(database_url) == (0, 0, 0)  # not before the commit
        conn.commit()
    assert _written(database_url) == (2, 1, 1)
    assert jobs.on_complete is not None
    assert _row(database_url, jobs.on_complete.job_id)[0] == "held"


class _NotATask:
    pass


@pytest.mark.parametrize(
    ("jobs", "options", "message"),
    [
        (
            [("item", {})] * (MAX_BATCH_JOBS + 1),
            {"on_complete": "summarize"},
            f"a batch with on_complete or on_failure takes at most {MAX_BATCH_JOBS} jobs, "
            f"not {MAX_BATCH_JOBS + 1}",
        ),
        ([], {"on_failure": "summarize"}, "needs at least one job"),
        (
            [("item", {}), ("item", [1])],
            {"on_complete": "summarize"},
            "job 1: payload must be a JSON object",
        ),
        (
            [JobSpec("item", {}, unique_key="k")],
            {"on_complete": "summarize"},
            "job 0: unique_key is not taken in a batch with on_complete or on_failure",
        ),
        (
            [("item", {})],
            {"on_complete": _NotATask()},
            "on_complete must be a task, a task's name or a JobSpec, not _NotATask",
        ),
        (
            [("item", {})],
            {"on_failure": JobSpec("summarize", {}, priority=1000)},
            "on_failure: priority must be an integer",
        ),
    ],
    ids=["too-wide", "empty", "bad-job", "unique-key", "bad-callback", "bad-callback-option"],
)
def test_a_bad_batch_is_refused_with_nothing_written(
    database_url, monkeypatch, jobs, options, message
):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    with pytest.raises(InvalidJob) as raised:
        client.enqueue_many(jobs, **options)
    assert message in str(raised.value)
    assert sent == []
    monkeypatch.undo()
    assert _written(database_url) == (0, 0, 0)


def test_a_batch_without_callbacks_is_the_plain_list_it_always_was(database_url, monkeypatch):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    jobs = client.enqueue_many([("item", {"n": n}) for n in range(3)])
    monkeypatch.undo()
    assert type(jobs) is list and len(jobs) == 3
    assert len(sent) == 1 and sent[0].startswith("COPY worker.jobs")
    assert _written(database_url) == (3, 0, 0)


@pytest.mark.parametrize("second", ["completed", "failed"])
def test_a_retried_failed_job_of_a_batch_no_longer_counts_as_failed(
    env, database_url, processes: Processes, second
):
    """A job of a batch fails while another still runs, and is retried: the callbacks wait for
    it again and no longer count its failure. Completed the second time, `on_failure` is
    cancelled as not needed; failed again, it runs, reading one failure (migration 0018)."""
    client = Client(database_url)
    jobs = client.enqueue_many(
        [("item", {"n": n}) for n in range(2)], on_complete="summarize", on_failure="summarize"
    )
    assert jobs.on_complete is not None and jobs.on_failure is not None
    callbacks = (jobs.on_complete.job_id, jobs.on_failure.job_id)
    counts = "SELECT waiting_on, failed_parents, status FROM worker.jobs WHERE id = %s"
    ended = "UPDATE worker.jobs SET status = %s, finished_at = now() WHERE id = %s"
    query(database_url, ended, ("failed", jobs[0].job_id))
    assert [query(database_url, counts, (c,)) for c in callbacks] == [[(1, 1, "held")]] * 2
    client.retry(jobs[0].job_id)
    assert [query(database_url, counts, (c,)) for c in callbacks] == [[(2, 0, "held")]] * 2
    query(database_url, ended, (second, jobs[0].job_id))
    query(database_url, ended, ("completed", jobs[1].job_id))
    processes.worker(env, "batchtasks")
    failed = int(second == "failed")
    result = jobs.on_complete.wait_sync(timeout=30)
    assert result == {"completed": 2 - failed, "failed": failed, "cancelled": 0, "deleted": 0}
    if failed:
        assert jobs.on_failure.wait_sync(timeout=30) == result
    else:
        wait_for(partial(_ended, database_url, callbacks[1]), message="on_failure ended")
        assert _row(database_url, callbacks[1])[:2] == ("cancelled", NOT_NEEDED)
        assert _runs(database_url, callbacks[1]) == []
