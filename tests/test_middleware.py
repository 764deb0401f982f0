"""Middleware runs around every attempt a real worker makes: in order, with the failure's
exception, in the job's own context, and a middleware that raises never costs a job."""

from __future__ import annotations

import pytest
from support import Processes, effects, wait_for

from worker import Client, JobFailed, Middleware, add_middleware, remove_middleware


def test_hooks_wrap_a_sync_attempt_in_order_and_the_task_sees_their_context(
    env, database_url, processes: Processes
):
    processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("sync_job", {})
    assert job.wait_sync(timeout=30) == "ok"
    assert effects(database_url, job.id) == [
        "outer.before attempt 1",
        "inner.before",
        "sync task sees job True",  # the context variable set in `before`, in the task's thread
        "inner.after completed",
        "outer.after completed",
    ]


def test_a_failed_async_attempt_tells_on_error_its_exception_before_after(
    env, database_url, processes: Processes
):
    processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("async_job", {"failures": 1})
    assert job.wait_sync(timeout=30) == "ok"
    assert effects(database_url, job.id) == [
        "outer.before attempt 1",
        "inner.before",
        "async task sees job True",
        "inner.on_error ValueError",
        "inner.after retry",
        "outer.on_error ValueError: attempt 1 fails",
        "outer.after retry",
        "outer.before attempt 2",
        "inner.before",
        "async task sees job True",
        "inner.after completed",
        "outer.after completed",
    ]


def test_an_attempt_that_fails_for_good_is_reported_as_failed(
    env, database_url, processes: Processes
):
    processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("sync_job", {"failures": 5}, max_retries=0)
    with pytest.raises(JobFailed, match="attempt 1 fails"):
        job.wait_sync(timeout=30)
    # The outcome is a retry; with no retries left, the job is failed where it is written.
    assert effects(database_url, job.id)[-2:] == [
        "outer.on_error ValueError: attempt 1 fails",
        "outer.after retry",
    ]


def test_a_retry_the_code_asks_for_is_not_an_error(env, database_url, processes: Processes):
    processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("retried_job", {})
    assert job.wait_sync(timeout=30) == "ok"
    assert effects(database_url, job.id) == [
        "outer.before attempt 1",
        "inner.before",
        "inner.after retry",
        "outer.after retry",
        "outer.before attempt 2",
        "inner.before",
        "inner.after completed",
        "outer.after completed",
    ]


def test_a_pipeline_attempt_is_wrapped_once_and_on_error_gets_the_failed_stage_exception(
    env, database_url, processes: Processes
):
    processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("mw_flow", {"failures": 1})
    assert job.wait_sync(timeout=30) == 2
    assert effects(database_url, job.id) == [
        "outer.before attempt 1",
        "inner.before",
        "fetch sees job True",
        "store sees job True",
        "inner.on_error KeyError",
        "inner.after retry",
        "outer.on_error KeyError: 'no such bucket'",
        "outer.after retry",
        "outer.before attempt 2",
        "inner.before",
        "store sees job True",  # its completed stage is not run again
        "inner.after completed",
        "outer.after completed",
    ]


@pytest.mark.parametrize("hooks", [["before"], ["on_error", "after"]])
def test_a_middleware_that_raises_is_logged_and_the_job_runs_as_without_it(
    env, database_url, processes: Processes, hooks: list[str]
):
    worker = processes.worker(env, "middlewaretasks")
    job = Client(database_url).enqueue("sync_job", {"failures": 1, "raise_in": hooks})
    assert job.wait_sync(timeout=30) == "ok"
    assert job.retry_count == 1  # the one failure is the task's own
    ran = effects(database_url, job.id)
    assert ran.count("sync task sees job True") == 2
    assert ran[-1] == "outer.after completed"  # the other middleware ran all the same
    for hook in hooks:
        wait_for(
            lambda hook=hook: (
                f"middleware Faulty.{hook} raised on job {job.id}" in processes.log(worker)
            ),
            timeout=10,
            message=f"the log to name Faulty.{hook}",
        )
    assert f"RuntimeError: faulty {hooks[0]}" in processes.log(worker)


def test_add_middleware_refuses_an_object_with_no_hooks():
    with pytest.raises(TypeError, match="has none of the methods before, after, on_error"):
        add_middleware(object())


def test_a_removed_middleware_no_longer_runs():
    from worker.middleware import MIDDLEWARE

    mw = add_middleware(Middleware())
    assert mw in MIDDLEWARE
    remove_middleware(mw)
    assert mw not in MIDDLEWARE
