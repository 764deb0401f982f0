"""A task's own retry policy: how many retries, how long between them, what is never retried.

Real `worker run` processes on a real PostgreSQL; the tasks are in `tests/flowtasks.py`.
"""

from __future__ import annotations

import pytest

from worker import Client, JobFailed


@pytest.fixture
def client(database_url):
    return Client(database_url)


def ran(db, job_id: str) -> int:
    return db.query("SELECT count(*) FROM effects WHERE job = %s", (job_id,))[0][0]


def test_an_exception_the_task_gives_up_on_fails_the_job_without_a_retry(
    env, db, processes, client
):
    processes.worker(env, "flowtasks")
    job = client.enqueue("rejects", {})
    with pytest.raises(JobFailed, match="ValueError: this payload can never work"):
        job.wait_sync(timeout=20)
    assert job.retry_count == 0
    assert ran(db, job.job_id) == 1


def test_a_task_s_own_max_retries_overrides_the_worker_s(env, db, processes, client):
    processes.worker(env, "flowtasks", extra={"WORKER_MAX_RETRIES": "5"})
    job = client.enqueue("fails_twice_at_most", {})
    with pytest.raises(JobFailed, match="still broken"):
        job.wait_sync(timeout=20)
    assert (job.retry_count, ran(db, job.job_id)) == (1, 2)


def test_a_job_s_own_max_retries_overrides_its_task_s(env, db, processes, client):
    processes.worker(env, "flowtasks")
    job = client.enqueue("fails_twice_at_most", {}, max_retries=0)
    with pytest.raises(JobFailed):
        job.wait_sync(timeout=20)
    assert (job.retry_count, ran(db, job.job_id)) == (0, 1)


def test_retry_after_runs_the_job_again_no_sooner_than_asked(env, db, processes, client):
    processes.worker(env, "flowtasks")
    job = client.enqueue("retries_later", {"after": 1.5})
    assert job.wait_sync(timeout=20) == 2
    assert job.retry_count == 1
    ((gap,),) = db.query(
        "SELECT extract(epoch FROM max(at) - min(at)) FROM effects WHERE job = %s", (job.job_id,)
    )
    assert gap >= 1.4  # the second attempt waited for the delay the task asked for


def test_a_pipeline_that_gives_up_fails_without_a_retry_and_still_cleans_up(
    env, db, processes, client
):
    processes.worker(env, "flowtasks")
    job = client.enqueue("gives_up", {})
    with pytest.raises(JobFailed, match="this order can never ship"):
        job.wait_sync(timeout=20)
    assert job.retry_count == 0
    assert sorted(db.effects(job.job_id)) == ["cleanup", "stage"]
