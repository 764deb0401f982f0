"""`worker.testing`: the pytest plugin users test their own tasks with.

A user's test file, run in a pytest subprocess (`pytester`), gets `worker_database` with no
conftest and drains its jobs; the direct tests run `drain` and `crash_after` against this
suite's database.
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time

import psycopg
import pytest
from support import query

from worker import Client, JobStatus, Pipeline, Retry, task
from worker.settings import get_settings
from worker.testing import NoCrash, drain, drain_async

pytest_plugins = ["pytester"]

ran: list[str] = []  # what the tasks below did, in order: they run in this process


@task(name="plugin_add")
def plugin_add(payload):
    ran.append(f"add {payload['a']}+{payload['b']}")
    return payload["a"] + payload["b"]


@task(name="plugin_retry_once")
def plugin_retry_once(payload, ctx):
    if ctx.attempt == 1:
        raise Retry(after=0)
    return ctx.attempt


@task(name="plugin_hang")
async def plugin_hang(payload):
    await asyncio.sleep(60)


export = Pipeline("plugin_export")


@export.stage
def plugin_extract(ctx):
    ran.append("extract")
    return {"rows": 3}


@export.stage
def plugin_load(ctx):
    ran.append("load")
    return {"loaded": ctx.outputs["plugin_extract"]["rows"]}


@export.cleanup
def plugin_tidy(ctx):
    ran.append("tidy")


no_cleanup = Pipeline("plugin_no_cleanup")


@no_cleanup.stage
def plugin_only_stage(ctx):
    return 1


held_open = threading.Event()  # set once `plugin_held_open` runs
release = threading.Event()  # lets it return


@task(name="plugin_held_open")
def plugin_held_open(payload):
    held_open.set()
    release.wait(30)


@task(name="plugin_hourly", every=3600)
def plugin_hourly(payload):
    ran.append("hourly")


@task(name="plugin_watches_schedules")
def plugin_watches_schedules(payload):
    """Whether a job of `plugin_hourly` appeared within `seconds` while this one ran."""
    give_up = time.monotonic() + payload["seconds"]
    while time.monotonic() < give_up:
        if query(payload["url"], "SELECT FROM worker.jobs WHERE task = 'plugin_hourly'"):
            return True
        time.sleep(0.02)
    return False


def overdue_schedule(url: str) -> None:
    """`plugin_hourly`'s schedule as a worker left it two hours ago: a tick is due now."""
    query(
        url,
        "INSERT INTO worker.schedules (key, task, spec, last_tick) "
        "VALUES ('plugin_hourly every 3600s', 'plugin_hourly', 'every 3600s', "
        "now() - interval '2 hours')",
    )


@pytest.fixture(autouse=True)
def _forget_runs():
    ran.clear()


@pytest.fixture
def one_at_a_time(monkeypatch):
    """The drains of this test run one job at a time, so jobs finish in their claim order."""
    monkeypatch.setenv("WORKER_CONCURRENCY", "1")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


# -- drain --------------------------------------------------------------------------------


@pytest.mark.smoke
def test_drain_runs_every_due_job_and_returns_them_in_the_order_they_finished(
    database_url, one_at_a_time
):
    client = Client(database_url)
    first = client.enqueue("plugin_add", {"a": 1, "b": 2}, priority=5)
    second = client.enqueue("plugin_add", {"a": 3, "b": 4})
    later = client.enqueue("plugin_add", {"a": 0, "b": 0}, delay=3600)
    jobs = drain(url=database_url)
    assert [j.job_id for j in jobs] == [first.job_id, second.job_id]
    assert [(j.status, j.result) for j in jobs] == [
        (JobStatus.COMPLETED, 3),
        (JobStatus.COMPLETED, 7),
    ]
    assert client.get(later.job_id).status == JobStatus.PENDING  # not due: not waited for
    assert ran == ["add 1+2", "add 3+4"]
    assert jobs[0].refresh().status == JobStatus.COMPLETED  # the handles stay usable


def test_drain_runs_only_the_queues_it_is_given(database_url):
    client = Client(database_url)
    other = client.enqueue("plugin_add", {"a": 5, "b": 5}, queue="other")
    default = client.enqueue("plugin_add", {"a": 6, "b": 6})
    assert [j.job_id for j in drain(url=database_url, queues=["other"])] == [other.job_id]
    assert client.get(default.job_id).status == JobStatus.PENDING


def test_drain_leaves_a_job_of_a_task_not_registered_here_pending_and_does_not_wait_for_it(
    database_url,
):
    client = Client(database_url)
    typo = client.enqueue("plugin_ad", {"a": 1, "b": 1})
    known = client.enqueue("plugin_add", {"a": 2, "b": 2})
    assert [j.job_id for j in drain(url=database_url, timeout=5)] == [known.job_id]
    left = client.get(typo.job_id)
    assert (left.status, left.retry_count, left.error) == (JobStatus.PENDING, 0, None)


def test_a_task_registered_while_a_drain_runs_is_left_to_the_next_drain_not_waited_for(
    database_url,
):
    client = Client(database_url)
    first = client.enqueue("plugin_held_open")
    drained: list[list[str]] = []
    running = threading.Thread(
        target=lambda: drained.append([j.job_id for j in drain(url=database_url, timeout=20)])
    )
    running.start()
    try:
        assert held_open.wait(10)

        @task(name="plugin_registered_late")
        def registered_late(payload):
            return "late"

        late = client.enqueue("plugin_registered_late")
    finally:
        release.set()
        running.join(30)
    assert drained == [[first.job_id]]
    [done] = drain(url=database_url, timeout=10)
    assert (done.job_id, done.result) == (late.job_id, "late")


def test_drain_returns_at_once_when_nothing_is_due(database_url):
    assert drain(url=database_url, timeout=2) == []


def test_a_retry_due_at_once_runs_within_the_same_drain(database_url):
    job = Client(database_url).enqueue("plugin_retry_once")
    [done] = drain(url=database_url)
    assert (done.job_id, done.status, done.result) == (job.job_id, JobStatus.COMPLETED, 2)
    assert done.retry_count == 1


def test_drain_past_its_timeout_says_how_many_jobs_are_left_and_hands_them_back(database_url):
    client = Client(database_url)
    hanging = client.enqueue("plugin_hang")
    with pytest.raises(TimeoutError, match=r"1 jobs left \(\d due, \d running\) after 1.0 s"):
        drain(url=database_url, timeout=1.0)
    back = client.get(hanging.job_id)
    assert (back.status, back.retry_count) == (JobStatus.PENDING, 0)  # no attempt counted


def test_drain_called_on_a_running_event_loop_and_its_async_twin_both_run_jobs(database_url):
    client = Client(database_url)

    async def from_async_code():
        client.enqueue("plugin_add", {"a": 1, "b": 1})
        sync_jobs = drain(url=database_url)  # runs its own loop in a thread
        client.enqueue("plugin_add", {"a": 2, "b": 2})
        return sync_jobs, await drain_async(url=database_url)

    sync_jobs, async_jobs = asyncio.run(from_async_code())
    assert [j.result for j in sync_jobs] == [2]
    assert [j.result for j in async_jobs] == [4]


def test_drain_does_not_fire_the_periodic_tasks_of_the_test_process(database_url):
    """`[done] = drain()` holds while a registered periodic task has a tick due: the job
    watches, while it runs, for the job that tick would enqueue (which a worker firing its
    schedules enqueues at its start)."""
    overdue_schedule(database_url)
    job = Client(database_url).enqueue(
        "plugin_watches_schedules", {"url": database_url, "seconds": 1.0}
    )
    [done] = drain(url=database_url)
    assert (done.job_id, done.result) == (job.job_id, False)
    assert query(database_url, "SELECT count(*) FROM worker.jobs WHERE task = 'plugin_hourly'") == [
        (0,)
    ]
    assert "hourly" not in ran


def test_drain_with_schedules_fires_the_ticks_due_and_runs_their_jobs(database_url):
    overdue_schedule(database_url)
    [done] = drain(url=database_url, schedules=True)
    assert (done.task, done.status) == ("plugin_hourly", JobStatus.COMPLETED)
    assert ran == ["hourly"]


# -- crash_after --------------------------------------------------------------------------


def test_crash_after_a_stage_loses_the_attempt_and_the_next_drain_runs_the_owed_cleanup(
    database_url,
):
    job = Client(database_url).enqueue("plugin_export")
    [lost] = drain(url=database_url, crash_after="plugin_extract")
    # As a rescue leaves a killed worker's job: pending again, the attempt counted.
    assert (lost.job_id, lost.status, lost.retry_count) == (job.job_id, JobStatus.PENDING, 1)
    assert "was lost" in lost.error
    assert lost.outputs == {"plugin_extract": {"rows": 3}}  # the stage's completion was kept
    assert ran == ["extract"]  # the killed attempt ran no cleanup

    [done] = drain(url=database_url)
    assert (done.status, done.result) == (JobStatus.COMPLETED, {"loaded": 3})
    # The cleanup the lost attempt owed, then the rest of the job and its own cleanup.
    assert ran == ["extract", "tidy", "load", "tidy"]


def test_crash_after_a_cleanup_runs_that_cleanup_again_on_the_next_drain(database_url):
    Client(database_url).enqueue("plugin_export")
    [lost] = drain(url=database_url, crash_after="plugin_tidy")
    assert lost.status == JobStatus.PENDING
    assert ran == ["extract", "load", "tidy"]
    [done] = drain(url=database_url)
    assert done.status == JobStatus.COMPLETED
    assert ran == ["extract", "load", "tidy", "tidy"]  # no stage ran twice; the cleanup did


def test_crash_after_a_stage_no_job_reached_says_so(database_url):
    with pytest.raises(NoCrash, match="no job completed that stage"):
        drain(url=database_url, crash_after="plugin_load")


def test_crash_after_refuses_a_stage_it_cannot_crash_after(database_url):
    with pytest.raises(ValueError, match="no registered pipeline has a stage of that name"):
        drain(url=database_url, crash_after="no_such_stage")
    with pytest.raises(ValueError, match="plugin_no_cleanup, which has no cleanup"):
        drain(url=database_url, crash_after="plugin_only_stage")


# -- the plugin, as a user's test suite sees it ---------------------------------------------

USER_TESTS = """
from worker import JobStatus, Pipeline, enqueue, task
from worker.testing import drain

ran = []
urls = []


@task
def greet(payload):
    return f"hello {payload['name']}"


export = Pipeline("export")


@export.stage
def extract(ctx):
    ran.append("extract")
    return {"rows": 3}


@export.stage
def load(ctx):
    ran.append("load")
    return {"loaded": ctx.outputs["extract"]["rows"]}


@export.cleanup
def remove_scratch(ctx):
    ran.append("cleanup")


def test_a_task_runs_on_drain(worker_database):
    urls.append(worker_database)
    job = enqueue("greet", {"name": "ada"})
    [done] = drain()
    assert (done.job_id, done.status, done.result) == (job.job_id, JobStatus.COMPLETED, "hello ada")
    enqueue("greet", {"name": "left behind"})  # due, but this test's database goes with it


def test_each_test_gets_a_fresh_database(worker_database):
    assert worker_database not in urls
    assert drain() == []


def test_cleanup_runs_again_after_a_crash(worker_database):
    enqueue("export")
    [lost] = drain(crash_after="extract")
    assert (lost.status, lost.retry_count) == (JobStatus.PENDING, 1)
    assert ran == ["extract"]
    [done] = drain()
    assert done.status == JobStatus.COMPLETED
    assert ran == ["extract", "cleanup", "load", "cleanup"]
"""


def test_a_users_suite_gets_a_fresh_database_per_test_and_drains_with_no_conftest(
    pytester, pg_server, monkeypatch
):
    monkeypatch.setenv("TEST_DATABASE_URL", pg_server)
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    # Every database the run made is gone with it, its template too.
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'dw\\_%'")
        assert left.fetchall() == []


EMBEDDED_TESTS = """
import os
from worker import enqueue
from worker.testing import drain


def test_runs_on_a_server_of_its_own(worker_database):
    with open(os.environ["URL_FILE"], "w") as out:
        out.write(worker_database)
    enqueue("greet_embedded", {})
    assert [job.result for job in drain()] == ["hi"]


from worker import task


@task
def greet_embedded(payload):
    return "hi"
"""


def test_without_test_database_url_a_server_is_started_for_the_session_and_stopped(
    pytester, monkeypatch, tmp_path
):
    monkeypatch.delenv("TEST_DATABASE_URL", raising=False)
    url_file = tmp_path / "url"
    monkeypatch.setenv("URL_FILE", str(url_file))
    pytester.makepyfile(test_embedded=textwrap.dedent(EMBEDDED_TESTS))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    with pytest.raises(psycopg.OperationalError):  # the session's server is stopped
        psycopg.connect(url_file.read_text(), connect_timeout=3).close()
