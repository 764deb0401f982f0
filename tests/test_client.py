"""The `Job` handle and the clients: waiting across processes, the verbs, `worker enqueue`.

Every job here runs in a real `worker run` subprocess against the test's own database.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from support import effects, query, status_of, wait_for

import worker.client.waiting as client_module
from worker import (
    AsyncClient,
    Client,
    InvalidJob,
    InvalidTransition,
    Job,
    JobCancelledError,
    JobError,
    JobFailed,
    JobNotFound,
    JobSpec,
    JobStatus,
)


def worker_ready(url: str) -> None:
    wait_for(lambda: query(url, "SELECT count(*) FROM worker.workers")[0][0], message="worker up")


class Waiter(threading.Thread):
    """`wait_sync` in a thread, keeping what it returned or raised and when."""

    def __init__(self, job: Job, timeout: float | None = None) -> None:
        super().__init__(daemon=True)
        self.job, self.timeout = job, timeout
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at: float | None = None

    def run(self) -> None:
        try:
            self.result = self.job.wait_sync(timeout=self.timeout)
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.time()


def listeners(url: str) -> int:
    return int(
        query(
            url,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (client_module.LISTENER_NAME,),
        )[0][0]
    )


# -- wait_sync: every way a job can end ---------------------------------------------------


def test_wait_sync_returns_the_result_of_a_job_run_by_another_process(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("add", {"a": 2, "b": 40})
    assert job.wait_sync(timeout=30) == 42
    assert job.status == JobStatus.COMPLETED
    assert job.result == 42 and job.error is None and job.finished_at is not None


def test_wait_sync_raises_a_runtime_error_carrying_the_error_of_a_failed_job(
    env, database_url, processes
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("always_fails", {"key": "f"}, max_retries=1)
    with pytest.raises(JobFailed) as raised:
        job.wait_sync(timeout=30)
    assert isinstance(raised.value, RuntimeError)
    assert "RuntimeError: this task always fails" in (raised.value.error or "")
    assert raised.value.job.status == JobStatus.FAILED
    assert job.status == JobStatus.FAILED and job.retry_count == 1
    assert effects(database_url, "f") == ["attempt", "attempt"]


def test_wait_sync_raises_when_a_running_job_is_cancelled(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("counted", {"second_sleep": 2})
    wait_for(lambda: "second" in effects(database_url, job.job_id), message="second stage")
    assert job.cancel() == JobStatus.PROCESSING  # cooperative: it stops at the next boundary
    with pytest.raises(JobCancelledError) as raised:
        job.wait_sync(timeout=30)
    assert isinstance(raised.value, JobError) and isinstance(raised.value, RuntimeError)
    assert raised.value.error == "cancelled before stage third"
    assert job.status == JobStatus.CANCELLED
    assert effects(database_url, job.job_id) == ["first", "second", "cleanup"]


def test_wait_sync_raises_at_once_for_a_job_cancelled_before_it_ran(database_url):
    client = Client(database_url)
    job = client.enqueue("add", {"a": 1, "b": 1})
    assert client.cancel(job.job_id) == JobStatus.CANCELLED
    started = time.monotonic()
    with pytest.raises(JobCancelledError):
        job.wait_sync(timeout=30)
    assert time.monotonic() - started < 5


def test_wait_sync_timeout_returns_without_raising_and_shows_the_current_status(
    env, database_url, processes
):
    client = Client(database_url)
    pending = client.enqueue("effect", {"key": "p"}, queue="nobody-serves-this")
    started = time.monotonic()
    assert pending.wait_sync(timeout=0.5) is None
    assert 0.5 <= time.monotonic() - started < 5
    assert pending.status == JobStatus.PENDING

    processes.worker(env, "testtasks")
    running = client.enqueue("effect", {"key": "r", "sleep": 4})
    wait_for(lambda: status_of(database_url, running.job_id) == "processing", message="running")
    assert running.wait_sync(timeout=0.5) is None
    assert running.status == JobStatus.PROCESSING and running.started_at is not None
    assert running.wait_sync(timeout=30) == "done"  # the same handle can wait again


def test_waiting_on_a_paused_job_keeps_waiting_until_it_is_resumed_and_finishes(
    env, database_url, processes
):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("ask", {"question": "ship it?"})
    waiter = Waiter(job, timeout=60)
    waiter.start()
    wait_for(lambda: status_of(database_url, job.job_id) == "paused", message="paused")
    time.sleep(client_module.WAIT_RECHECK_SECONDS + 1)  # at least one recheck saw it paused
    assert waiter.is_alive()
    # A timed-out wait on the paused job returns with the status showing it.
    other = client.get(job.job_id)
    assert other.wait_sync(timeout=0.3) is None and other.status == JobStatus.PAUSED
    client.resume(job.job_id, {"approved": True})
    waiter.join(30)
    assert waiter.error is None
    assert waiter.result == {"answer": {"approved": True}}


# -- how waiting is woken ------------------------------------------------------------------


def test_wait_is_woken_by_the_notification_not_the_recheck(
    env, database_url, processes, monkeypatch
):
    # With a recheck every 60 s, only the worker's NOTIFY can end the wait promptly.
    monkeypatch.setattr(client_module, "WAIT_RECHECK_SECONDS", 60.0)
    processes.worker(env, "testtasks")
    client = Client(database_url)
    for key in ("one", "two", "three"):
        job = client.enqueue("effect", {"key": key, "sleep": 1})
        waiter = Waiter(job, timeout=30)
        waiter.start()
        waiter.join(40)
        assert waiter.result == "done", waiter.error
        assert job.finished_at is not None and waiter.returned_at is not None
        latency = waiter.returned_at - job.finished_at.timestamp()
        assert latency < 1.0, f"the wait returned {latency:.2f} s after the job finished"


def test_wait_returns_when_the_notification_is_missed(database_url):
    client = Client(database_url)
    job = client.enqueue("add", {"a": 1, "b": 2}, queue="nobody-serves-this")
    waiter = Waiter(job, timeout=30)
    waiter.start()
    time.sleep(0.5)
    # Finished by a statement that sends no NOTIFY (as if the notification were lost):
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', result = '3', finished_at = now() "
        "WHERE id = %s",
        (job.job_id,),
    )
    finished = time.time()
    waiter.join(30)
    assert waiter.result == 3
    assert waiter.returned_at is not None
    assert waiter.returned_at - finished <= client_module.WAIT_RECHECK_SECONDS + 2


def test_wait_survives_losing_its_listening_connection(env, database_url, processes, monkeypatch):
    monkeypatch.setattr(client_module, "WAIT_RECHECK_SECONDS", 60.0)
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("effect", {"key": "k", "sleep": 3})
    waiter = Waiter(job, timeout=40)
    waiter.start()
    wait_for(lambda: listeners(database_url) == 1, message="the listener")
    query(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND datname = current_database()",
        (client_module.LISTENER_NAME,),
    )
    waiter.join(40)
    assert waiter.result == "done", waiter.error
    assert waiter.returned_at is not None and job.finished_at is not None
    # Woken by a notification on the new connection, not by the 60 s recheck.
    assert waiter.returned_at - job.finished_at.timestamp() < 1.0
    assert listeners(database_url) == 1


def test_many_waiters_share_one_listening_connection(env, database_url, processes):
    client = Client(database_url)
    jobs = client.enqueue_many([JobSpec("effect", {"key": str(i), "sleep": 1}) for i in range(20)])
    waiters = [Waiter(job, timeout=60) for job in jobs]
    for waiter in waiters:
        waiter.start()
    wait_for(lambda: listeners(database_url) >= 1, message="the listener")
    time.sleep(0.5)
    assert listeners(database_url) == 1
    processes.worker(env, "testtasks", extra={"WORKER_CONCURRENCY": "20"})
    for waiter in waiters:
        waiter.join(60)
    assert [w.result for w in waiters] == ["done"] * 20


# -- the async wait -------------------------------------------------------------------------


def test_async_wait_for_completed_failed_cancelled_and_timed_out_jobs(
    env, database_url, processes, monkeypatch
):
    monkeypatch.setattr(client_module, "WAIT_RECHECK_SECONDS", 60.0)
    processes.worker(env, "testtasks")

    async def main() -> None:
        client = AsyncClient(database_url)
        done = await client.enqueue("async_double", {"n": 21})
        assert await done.wait(timeout=30) == 42
        assert done.status == JobStatus.COMPLETED and done.finished_at is not None
        assert time.time() - done.finished_at.timestamp() < 1.0  # woken by the notification

        failed = await client.enqueue("always_fails", {"key": "af"}, max_retries=0)
        with pytest.raises(JobFailed, match="this task always fails") as raised:
            await failed.wait(timeout=30)
        assert isinstance(raised.value, RuntimeError) and raised.value.job.status == "failed"

        cancelled = await client.enqueue("counted", {"second_sleep": 2})
        while "second" not in effects(database_url, cancelled.job_id):
            await asyncio.sleep(0.05)
        assert await client.cancel(cancelled.job_id) == JobStatus.PROCESSING
        with pytest.raises(JobCancelledError) as raised_c:
            await cancelled.wait(timeout=30)
        assert raised_c.value.error == "cancelled before stage third"

        slow = await client.enqueue("effect", {"key": "slow", "sleep": 3})
        started = time.monotonic()
        assert await slow.wait(timeout=0.5) is None
        assert time.monotonic() - started < 5
        assert slow.status in (JobStatus.PENDING, JobStatus.PROCESSING)
        await client.engine.dispose()

    asyncio.run(main())


def test_async_wait_on_a_job_from_the_blocking_client(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("add", {"a": 5, "b": 5})
    assert asyncio.run(job.wait(timeout=30)) == 10
    assert asyncio.run(job.wait(timeout=30)) == 10  # again, on a new event loop


# -- Job.get in another process -----------------------------------------------------------

WAIT_ELSEWHERE = """
import json, sys
from worker import Job, JobFailed
job = Job.get(sys.argv[1])
try:
    print(json.dumps({"result": job.wait_sync(timeout=30), "status": job.status}))
except JobFailed as exc:
    print(json.dumps({"error": exc.error.splitlines()[0], "status": job.status}))
"""


def test_job_get_in_another_process_waits_for_the_result(env, database_url, processes):
    client = Client(database_url)
    ok = client.enqueue("add", {"a": 20, "b": 22})
    bad = client.enqueue("always_fails", {}, max_retries=0)
    waiters = [
        subprocess.Popen(
            [sys.executable, "-c", WAIT_ELSEWHERE, job.job_id],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in (ok, bad)
    ]
    processes.worker(env, "testtasks")
    outputs = []
    for proc in waiters:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out))
    assert outputs == [
        {"result": 42, "status": "completed"},
        {"error": "RuntimeError: this task always fails", "status": "failed"},
    ]


# -- the verbs, on both clients -----------------------------------------------------------


def test_async_client_verbs(env, database_url, processes):
    processes.worker(env, "testtasks")

    async def main() -> None:
        client = AsyncClient(database_url)
        job = await client.enqueue("add", {"a": 1, "b": 2}, queue="default", priority=5)
        assert job.run_at is not None
        assert await job.wait(timeout=30) == 3
        got = await client.get(job.job_id)
        assert (got.status, got.result, got.priority) == (JobStatus.COMPLETED, 3, 5)

        many = await client.enqueue_many([("add", {"a": i, "b": i}) for i in range(5)])
        assert [await j.wait(timeout=30) for j in many] == [0, 2, 4, 6, 8]

        asked = await client.enqueue("ask", {"question": "go?"})
        while (await client.get(asked.job_id)).status != JobStatus.PAUSED:
            await asyncio.sleep(0.05)
        assert (await client.get(asked.job_id)).question == {"question": "go?"}
        resumed = await client.resume(asked.job_id, {"yes": 1})
        assert resumed.status in (JobStatus.PENDING, JobStatus.PROCESSING, JobStatus.COMPLETED)
        assert await asked.wait(timeout=30) == {"answer": {"yes": 1}}

        parked = await client.enqueue("add", {"a": 1, "b": 1}, queue="nobody-serves-this")
        assert await client.cancel(parked.job_id) == JobStatus.CANCELLED
        again = await client.retry(parked.job_id)
        assert again.status == JobStatus.PENDING and again.retry_count == 0
        with pytest.raises(InvalidTransition, match="not paused"):
            await client.resume(parked.job_id)
        with pytest.raises(InvalidTransition, match="only failed or cancelled"):
            await client.retry(job.job_id)
        with pytest.raises(JobNotFound):
            await client.get("00000000-0000-0000-0000-000000000000")

        query(database_url, "UPDATE worker.jobs SET finished_at = now() - interval '8 days'")
        assert await client.cleanup_jobs(older_than="7d") == 7  # job, 5 many, asked
        assert query(database_url, "SELECT id::text FROM worker.jobs") == [(parked.job_id,)]
        # A handle from the async client works from blocking code too.
        assert parked.refresh().status == JobStatus.PENDING
        await client.engine.dispose()

    asyncio.run(main())


def test_blocking_client_refuses_transitions_the_job_is_not_in(database_url):
    client = Client(database_url)
    job = client.enqueue("add", {"a": 1, "b": 1}, queue="nobody-serves-this")
    with pytest.raises(InvalidTransition, match="is pending, not paused"):
        client.resume(job.job_id, {"x": 1})
    with pytest.raises(InvalidTransition, match="only failed or cancelled jobs can be retried"):
        client.retry(job.job_id)
    with pytest.raises(JobNotFound):
        client.cancel("00000000-0000-0000-0000-000000000000")
    with pytest.raises(JobNotFound):
        Client(database_url).get("00000000-0000-0000-0000-000000000000").wait_sync()
    for verb in (client.get, client.cancel, client.retry, client.resume):
        with pytest.raises(JobNotFound, match="not a job id"):
            verb("nope")
    with pytest.raises(InvalidJob, match="answer is not JSON-serialisable"):
        client.resume(job.job_id, float("nan"))
    with pytest.raises(InvalidJob, match="WORKER_MAX_PAYLOAD_BYTES"):
        client.resume(job.job_id, "x" * (client.max_payload_bytes + 1))
    with pytest.raises(ValueError, match="timeout must be a number"):
        job.wait_sync(timeout=float("nan"))
    assert status_of(database_url, job.job_id) == "pending"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_retries": 2**31}, "max_retries must be an integer from 0 to 2147483647"),
        ({"delay": 1e13}, "from 0 to 100 years"),
        ({"delay": timedelta.max}, "from 0 to 100 years"),
        ({"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))}, "the years 2"),
        ({"task": "a\x00b"}, "task name"),
        ({"task": "a\ud800"}, "task name"),
        ({"queue": "mail\x00"}, "queue name"),
    ],
)
def test_options_past_what_the_database_holds_are_refused_before_anything_is_written(
    database_url, options, message
):
    """Also inside the caller's transaction, which must survive the refusal."""
    client = Client(database_url)
    task = options.pop("task", "add")
    with pytest.raises(InvalidJob, match=message):
        client.enqueue(task, {}, **options)
    with pytest.raises(InvalidJob, match=message):
        client.enqueue_many([JobSpec("add"), JobSpec(task, **options)])
    with client.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id int)")
        conn.exec_driver_sql("INSERT INTO orders VALUES (42)")
        with pytest.raises(InvalidJob, match=message):
            client.enqueue(task, {}, connection=conn, **options)
        conn.exec_driver_sql("INSERT INTO orders VALUES (43)")  # the transaction goes on
    assert query(database_url, "SELECT count(*) FROM orders") == [(2,)]
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


# -- `worker enqueue` ---------------------------------------------------------------------


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env={**env, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_enqueue_prints_the_job_id_and_stores_the_options(env, database_url):
    done = cli(
        env,
        "enqueue",
        "add",
        "--payload",
        '{"a": 1, "b": 2}',
        "--queue",
        "mail",
        "--priority",
        "7",
        "--delay",
        "60",
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    row = query(
        database_url,
        "SELECT task, payload, queue, priority, status, "
        "extract(epoch FROM run_at - created_at) FROM worker.jobs WHERE id = %s",
        (job_id,),
    )
    task, payload, queue, priority, status, delay = row[0]
    assert (task, payload, queue, priority, status) == (
        "add",
        {"a": 1, "b": 2},
        "mail",
        7,
        "pending",
    )
    assert 59 <= float(delay) <= 61  # type: ignore[arg-type]


def test_cli_enqueue_wait_prints_the_result_or_fails(env, database_url, processes):
    processes.worker(env, "testtasks")
    done = cli(env, "enqueue", "add", "--payload", '{"a": 20, "b": 22}', "--wait")
    assert done.returncode == 0, done.stderr
    job_id, result = done.stdout.split()
    assert result == "42"
    assert status_of(database_url, job_id) == "completed"

    failed = cli(env, "enqueue", "always_fails", "--max-retries", "0", "--wait")
    assert failed.returncode == 1
    assert failed.stderr.strip() == "error: job failed: RuntimeError: this task always fails"
    assert status_of(database_url, failed.stdout.strip()) == "failed"


def test_cli_enqueue_refuses_bad_json_in_one_line(env, database_url):
    for payload, message in [
        ('{"a": 1,', "--payload is not valid JSON"),
        ("[1, 2]", "payload must be a JSON object"),
    ]:
        done = cli(env, "enqueue", "add", "--payload", payload)
        assert done.returncode == 2
        assert done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("error: ") and message in done.stderr
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]
