"""Retention: finished jobs older than the cutoff go, with their stages and events; nothing else.

Jobs are written with SQL at chosen ages (a job cannot be made to finish eight days ago any
other way); `cleanup_jobs` and a real worker's retention duty then prune them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import event
from support import Processes, ago, insert_job, insert_stage, query, wait_for

from worker import AsyncClient, Client

OLD, RECENT = "10 days", "1 day"


def add_job(url: str, status: str, finished: str | None, created: str = OLD) -> str:
    """A job in `status`, created and (if given) finished that long ago, with a stage and an
    event; on a queue no worker serves, so only retention can change it."""
    job_id = insert_job(
        url,
        queue="nobody-serves-this",
        status=status,
        created_at=ago(created),
        finished_at=ago(finished),
    )
    insert_stage(url, job_id, "only")
    query(
        url,
        "INSERT INTO worker.job_events (job_id, step, status) VALUES (%s, 'only', 'completed')",
        (job_id,),
    )
    return job_id


def landscape(url: str) -> dict[str, str]:
    """Old finished jobs (to go) and everything that must stay, by name."""
    return {
        "old completed": add_job(url, "completed", OLD),
        "old failed": add_job(url, "failed", OLD),
        "old cancelled": add_job(url, "cancelled", OLD),
        "recent completed": add_job(url, "completed", RECENT),
        # Live jobs stay whatever their timestamps say (finished_at set by hand here).
        "old pending": add_job(url, "pending", OLD),
        "old processing": add_job(url, "processing", OLD),
        "old paused": add_job(url, "paused", OLD),
        "never finished": add_job(url, "pending", None),
    }


DOOMED = {"old completed", "old failed", "old cancelled"}


def remaining(url: str, jobs: dict[str, str]) -> dict[str, tuple[int, int, int]]:
    """Per named job: (job rows, stage rows, event rows) still in the database."""
    out = {}
    for name, job_id in jobs.items():
        counts = query(
            url,
            "SELECT (SELECT count(*) FROM worker.jobs WHERE id = %(id)s), "
            "(SELECT count(*) FROM worker.job_stages WHERE job_id = %(id)s), "
            "(SELECT count(*) FROM worker.job_events WHERE job_id = %(id)s)",
            {"id": job_id},
        )[0]
        out[name] = tuple(int(c) for c in counts)  # type: ignore[call-overload]
    return out  # type: ignore[return-value]


def expected_after_pruning(jobs: dict[str, str], doomed: set[str]) -> dict[str, tuple[int, ...]]:
    return {name: (0, 0, 0) if name in doomed else (1, 1, 1) for name in jobs}


def prune_statements(client: Client) -> list[str]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "DELETE FROM worker.jobs" in statement:
            seen.append(statement)

    event.listen(client.engine, "before_cursor_execute", record)
    return seen


def test_cleanup_jobs_removes_only_finished_jobs_older_than_the_cutoff(database_url):
    jobs = landscape(database_url)
    client = Client(database_url)
    batches = prune_statements(client)
    assert client.cleanup_jobs(older_than="7d", batch_size=2) == 3
    assert len(batches) == 2  # 2 + 1: small batches, each its own short transaction
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, DOOMED)
    assert client.cleanup_jobs(older_than="7d") == 0


def test_stages_and_events_go_with_their_job_however_it_is_deleted(database_url):
    jobs = landscape(database_url)
    gone = {"old completed", "old pending"}
    query(
        database_url,
        "DELETE FROM worker.jobs WHERE id = ANY(%s::uuid[])",
        ([jobs[name] for name in gone],),
    )
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, gone)
    query(database_url, "TRUNCATE worker.jobs")
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, set(jobs))


def test_cleanup_jobs_takes_any_age_and_only_the_statuses_asked_for(database_url):
    jobs = landscape(database_url)
    client = Client(database_url)
    assert client.cleanup_jobs(older_than="7d", statuses=["failed"]) == 1
    assert client.cleanup_jobs(older_than=7 * 86400, statuses="cancelled") == 1
    assert remaining(database_url, jobs) == expected_after_pruning(
        jobs, {"old failed", "old cancelled"}
    )
    assert client.cleanup_jobs(older_than="12h") == 2  # old and recent completed
    assert remaining(database_url, jobs) == expected_after_pruning(
        jobs, DOOMED | {"recent completed"}
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"statuses": ["pending"]}, "only finished jobs (completed, failed, cancelled)"),
        ({"statuses": ["completed", "processing"]}, "not processing"),
        ({"statuses": ["paused"]}, "not paused"),
        ({"statuses": ["bogus"]}, "unknown job status 'bogus'"),
        ({"older_than": "soon"}, "older_than must look like 30s, 15m, 12h, 7d or 2w"),
        ({"older_than": -60}, "older_than must be from 0 to 100 years"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
    ],
)
def test_cleanup_jobs_refuses_live_statuses_and_bad_options(database_url, options, message):
    jobs = landscape(database_url)
    with pytest.raises(ValueError) as raised:
        Client(database_url).cleanup_jobs(**options)
    assert message in str(raised.value)
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, set())


def test_async_cleanup_jobs(database_url):
    jobs = landscape(database_url)

    async def main() -> int:
        client = AsyncClient(database_url)
        try:
            return await client.cleanup_jobs(older_than="7d", batch_size=1)
        finally:
            await client.engine.dispose()

    assert asyncio.run(main()) == 3
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, DOOMED)


def test_worker_prunes_old_finished_jobs_on_its_schedule(env, database_url, processes: Processes):
    jobs = landscape(database_url)
    # More than one of the duty's 1,000-row batches.
    query(
        database_url,
        "INSERT INTO worker.jobs (task, status, created_at, finished_at) "
        "SELECT 'add', 'completed', now() - interval '9 days', now() - interval '8 days' "
        "FROM generate_series(1, 2500)",
    )
    # 'old processing' is held by a worker whose lease has not run out.
    query(
        database_url,
        "WITH w AS (INSERT INTO worker.workers (id, hostname, pid, queues, concurrency) "
        "VALUES (gen_random_uuid(), 'elsewhere', 1, '{default}', 1) RETURNING id) "
        "UPDATE worker.jobs SET worker_id = (SELECT id FROM w) WHERE id = %s",
        (jobs["old processing"],),
    )
    proc = processes.worker(
        env,
        "testtasks",
        # Default WORKER_RETENTION_DAYS (7); a long lease keeps the rescuer off 'old processing'.
        extra={"WORKER_RETENTION_INTERVAL": "0.5", "WORKER_LEASE_SECONDS": "120"},
    )
    # The duty deletes batch by batch, resting in between: wait for its last batch too.
    wait_for(
        lambda: query(database_url, "SELECT count(*) FROM worker.jobs") == [(len(jobs) - 3,)],
        timeout=60,
        message="retention to prune the old finished jobs",
    )
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, DOOMED)
    statuses = dict(
        query(
            database_url,
            "SELECT id::text, status FROM worker.jobs WHERE id = ANY(%s::uuid[])",
            (list(jobs.values()),),
        )
    )
    assert statuses == {
        jobs["recent completed"]: "completed",
        jobs["old pending"]: "pending",
        jobs["old processing"]: "processing",
        jobs["old paused"]: "paused",
        jobs["never finished"]: "pending",
    }
    wait_for(lambda: "retention removed" in processes.log(proc), message="the retention log line")


def test_worker_with_retention_disabled_keeps_old_jobs(env, database_url, processes):
    jobs = landscape(database_url)
    processes.worker(
        env,
        "testtasks",
        extra={"WORKER_RETENTION_ENABLED": "false", "WORKER_RETENTION_INTERVAL": "0.2"},
    )
    # The worker is up (it ran a job); then ten retention intervals pass.
    assert Client(database_url).enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=30) == 2
    time.sleep(2.0)
    assert remaining(database_url, jobs) == expected_after_pruning(jobs, set())
