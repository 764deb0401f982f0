"""A pipeline's cleanup is told what becomes of its job after the attempt it cleans up after
(`ctx.ending`), on the normal path and when it runs as owed after a killed worker: real worker
processes on a real PostgreSQL (`told_ending` in tests/testtasks.py records what it is told)."""

from __future__ import annotations

import os
import signal

import pytest
from support import effects, wait_for
from support import wait_for_status as wait_status

from worker import Client


@pytest.mark.parametrize(
    ("mode", "max_retries", "status", "told"),
    [
        pytest.param("ok", 1, "completed", ["cleanup completed"], id="completed"),
        pytest.param(
            "fail", 1, "failed", ["cleanup retry", "cleanup failed"], id="retry-then-failed"
        ),
        pytest.param("fail", 0, "failed", ["cleanup failed"], id="no-retry-left"),
    ],
)
def test_a_cleanup_is_told_whether_its_job_is_retried_failed_or_completed(
    env, database_url, processes, mode, max_retries, status, told
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("told_ending", {"mode": mode}, max_retries=max_retries)
    wait_status(database_url, job.job_id, status)
    seen = effects(database_url, job.job_id)
    assert [e for e in seen if e.startswith("cleanup")] == told
    assert seen.count("work") == len(told)  # one cleanup per attempt, after it


def test_a_cleanup_after_a_cancel_is_told_the_job_is_cancelled(env, database_url, processes):
    client = Client(database_url)
    processes.worker(env, "testtasks")
    job = client.enqueue("told_ending", {"mode": "hang"}, max_retries=3)
    wait_for(lambda: effects(database_url, job.job_id) == ["work"], message="the stage to start")
    client.cancel(job.job_id)
    wait_status(database_url, job.job_id, "cancelled")
    assert effects(database_url, job.job_id) == ["work", "cleanup cancelled"]


@pytest.mark.parametrize(
    ("max_retries", "status", "seen"),
    [
        pytest.param(
            1, "completed", ["work", "cleanup retry", "work", "cleanup completed"], id="retried"
        ),
        pytest.param(0, "failed", ["work", "cleanup failed"], id="out-of-attempts"),
    ],
)
def test_the_cleanup_a_killed_attempt_owes_is_told_whether_a_retry_follows(
    env, database_url, processes, max_retries, status, seen
):
    """The owed cleanup runs before the retry when one is left (it must keep what the retry
    needs), and as the job fails when none is."""
    job = Client(database_url).enqueue("told_ending", {"mode": "hang"}, max_retries=max_retries)
    doomed = processes.worker(env, "testtasks")
    wait_for(lambda: effects(database_url, job.job_id) == ["work"], message="the stage to start")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    processes.worker(env, "testtasks")  # recovers the job once the lease runs out
    wait_status(database_url, job.job_id, status, timeout=60)
    assert effects(database_url, job.job_id) == seen
