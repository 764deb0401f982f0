"""Outages and bounds: a real `worker run` process against a PostgreSQL that goes away.

The daemon must keep running through a restart or terminated sessions, say so in one line,
write the results of jobs that finished meanwhile, listen again, and never leave a job behind.
Bounds: task timeouts, stuck threads keeping their slot, a capped connection pool, and no
transaction (or row lock) held while a task runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from chaos.harness import OwnServer, reachable_again_seconds, wait_until, worker_env
from support import Processes, insert_job, query

from worker.daemon.db import Patience
from worker.db.postgres import POOL_CAP, POOL_WAIT, make_pool, pool_size
from worker.events import PostgresBus
from worker.models import ProgressEvent

TASKS = "chaos.faulttasks"
EFFECTS = (
    "CREATE TABLE chaos_effects (job uuid, kind text, attempt int, pid int, value float8, "
    "at timestamptz DEFAULT clock_timestamp())"
)


@pytest.fixture
def server() -> Iterator[OwnServer]:
    """A PostgreSQL of this test's own, to stop and start at will (same port throughout)."""
    own = OwnServer()
    query(own.url, EFFECTS)
    yield own
    own.destroy()


def job(url: str, job_id: str) -> dict[str, object]:
    row = query(
        url,
        "SELECT status, result, error, retry_count, started_at, finished_at "
        "FROM worker.jobs WHERE id = %s",
        (job_id,),
    )[0]
    return dict(
        zip(["status", "result", "error", "retry_count", "started", "finished"], row, strict=True)
    )


def status(url: str, job_id: str) -> str:
    try:
        return str(job(url, job_id)["status"])
    except psycopg.OperationalError:
        return "unknown (database down)"


def effects(url: str, job_id: str) -> int:
    return int(query(url, "SELECT count(*) FROM chaos_effects WHERE job = %s", (job_id,))[0][0])


def registered(url: str, proc) -> bool:
    return bool(query(url, "SELECT 1 FROM worker.workers WHERE pid = %s", (proc.pid,)))


# -- outages ----------------------------------------------------------------------------------


def test_result_of_a_job_finished_during_a_restart_is_written_once_the_database_is_back(
    server, processes: Processes
):
    url = server.url
    # Listening must come back too: with polls 20 s apart, only a NOTIFY starts a job quickly.
    env = worker_env(url, WORKER_LOG_LEVEL="INFO", WORKER_POLL_MAX="20")
    proc = processes.worker(env, TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    slow = insert_job(url, "hold_still", '{"sleep": 3}')
    wait_until(lambda: status(url, slow) == "processing", 30, "the job to start")

    server.stop()  # the job is mid-run and finishes while the database is down
    time.sleep(6)
    assert proc.poll() is None, processes.log(proc)
    server.start()

    wait_until(lambda: status(url, slow) == "completed", 60, "the job's result to be written")
    wait_until(lambda: "listener reconnected" in processes.log(proc), 30, "the listener")
    time.sleep(1)  # let the claim loop settle into its long idle poll
    quick = insert_job(url, "echo", '{"a": 1}')
    woke = wait_until(lambda: status(url, quick) == "completed", 30, "the next job")

    log = processes.log(proc)
    assert proc.poll() is None
    assert log.count("database unreachable (") == 1, log
    assert len(reachable_again_seconds(log)) == 1, log
    assert "Traceback" not in log
    done = job(url, slow)
    assert done["result"] == "held" and done["retry_count"] == 0  # written, not run again
    assert woke < 5, f"the next job waited {woke:.1f} s: the worker is not listening again"


def test_result_of_a_job_finished_while_stopping_during_a_restart_is_written(
    server, processes: Processes
):
    url = server.url
    proc = processes.worker(worker_env(url, WORKER_SHUTDOWN_GRACE="30"), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    slow = insert_job(url, "hold_still", '{"sleep": 3}')
    wait_until(lambda: status(url, slow) == "processing", 30, "the job to start")

    proc.send_signal(signal.SIGTERM)  # the job gets its grace period to finish
    server.stop()  # and finishes while the database is down, for longer than a pool wait
    time.sleep(POOL_WAIT + 5)
    server.start()

    assert proc.wait(timeout=60) == 0, processes.log(proc)
    done = job(url, slow)
    assert (done["status"], done["result"], done["retry_count"]) == ("completed", "held", 0)
    assert not query(url, "SELECT 1 FROM worker.workers"), "the worker did not deregister"


def test_statements_in_flight_across_an_outage_do_not_report_a_second_one(caplog):
    """A statement sent before the database went away may answer inside the outage, and one
    sent before it came back may fail after: neither is news about the database. Nor is an
    answer from a session a shutting-down server has not cut yet, while no new session opens."""
    lost = psycopg.OperationalError("terminating connection due to administrator command")
    accepting = False
    confirmations: list[bool] = []

    async def confirm() -> None:
        await asyncio.sleep(0.01)
        confirmations.append(accepting)
        if not accepting:
            raise psycopg.OperationalError("the database system is shutting down")

    async def outage() -> None:
        nonlocal accepting
        patience = Patience(lambda: False, confirm)
        sent_before_outage = time.monotonic()
        patience.failed("claiming jobs", lost, time.monotonic())
        patience.succeeded(sent_before_outage)  # an older statement answering late
        await asyncio.sleep(0.05)
        assert patience.down_since is not None and confirmations == []
        patience.succeeded(time.monotonic())  # a session not cut yet, the server shutting down
        await asyncio.sleep(0.05)
        assert patience.down_since is not None and confirmations == [False]
        patience.failed("recording job outcomes", lost, time.monotonic())  # the same outage
        accepting = True
        patience.succeeded(time.monotonic())  # within a second of the last try: not tried
        await asyncio.sleep(1.0)
        assert patience.down_since is not None and confirmations == [False]
        sent_during_outage = time.monotonic()
        patience.succeeded(time.monotonic())  # the database is back
        await asyncio.sleep(0.05)
        assert patience.down_since is None
        patience.failed("recording job outcomes", lost, sent_during_outage)
        assert patience.down_since is None
        patience.failed("recording job outcomes", lost, time.monotonic())  # a new outage
        assert patience.down_since is not None
        await patience.close()

    with caplog.at_level(logging.WARNING, logger="worker.daemon"):
        asyncio.run(outage())
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0].split(" after")[0] for line in lines] == [
        "database unreachable",
        "database reachable again",
        "database unreachable",
    ], lines
    assert confirmations == [False, True], "a recovery is confirmed on a new session first"


def test_statements_going_through_end_an_outage_while_new_sessions_are_refused(caplog, monkeypatch):
    """A server at its connection limit serves the pool's sessions and refuses new ones: the
    outage ends once statements have gone through for a while, and the confirming stops."""
    monkeypatch.setattr(Patience, "SURE_AFTER", 0.5)
    tries: list[float] = []

    async def confirm() -> None:
        tries.append(time.monotonic())
        raise psycopg.OperationalError("sorry, too many clients already")

    async def outage() -> None:
        patience = Patience(lambda: False, confirm)
        patience.failed("claiming jobs", psycopg.OperationalError("x"), time.monotonic())
        patience.succeeded(time.monotonic())
        await asyncio.sleep(1.2)
        patience.succeeded(time.monotonic())  # two answers, not a stream of them
        assert patience.down_since is not None
        started = time.monotonic()
        while patience.down_since is not None:
            assert time.monotonic() - started < 5, "the outage never ended"
            patience.succeeded(time.monotonic())
            await asyncio.sleep(0.05)
        await patience.close()

    with caplog.at_level(logging.WARNING, logger="worker.daemon"):
        asyncio.run(outage())
    assert len(tries) == 2, "one try a second, not one per statement"
    assert [r.getMessage().split(" (")[0].split(" after")[0] for r in caplog.records] == [
        "database unreachable",
        "database reachable again",
    ]


def test_pool_and_bus_connections_bound_how_long_a_silently_cut_network_holds_them(database_url):
    """A cut with no RST (a failed-over virtual IP) must end a statement in about a minute, not
    after TCP's quarter of an hour of retransmissions; an option in the URL wins."""

    async def parameters(url: str) -> list[dict[str, str]]:
        pool = make_pool(url, 10)
        await pool.open()
        bus = PostgresBus(url)
        bus.publish(ProgressEvent(job_id=str(uuid.uuid4()), step="s", status="progress"))
        try:
            async with pool.connection() as conn:
                seen = [conn.info.get_parameters()]
            await bus.flush()  # connects (the event itself is refused: no such job)
            assert bus._driver.events_connection is not None
            return [*seen, bus._driver.events_connection.info.get_parameters()]
        finally:
            await bus.aclose()
            await pool.close()

    daemon, events = asyncio.run(parameters(database_url))
    for params in (daemon, events):
        assert params["tcp_user_timeout"] == "60000"
        assert params["keepalives_idle"] == "30"
    assert events["fallback_application_name"] == "durable-worker-events"
    own = "&" if "?" in database_url else "?"
    (daemon, _) = asyncio.run(parameters(f"{database_url}{own}tcp_user_timeout=5000"))
    assert daemon["tcp_user_timeout"] == "5000"


def test_worker_started_while_the_database_is_down_waits_then_runs(server, processes):
    url = server.url
    server.stop()
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: "database unreachable" in processes.log(proc), 30, "the unreachable line")
    time.sleep(2)
    assert proc.poll() is None, processes.log(proc)
    server.start()
    job_id = insert_job(url, "echo", '{"a": 1}')
    wait_until(lambda: status(url, job_id) == "completed", 60, "the job to run")
    log = processes.log(proc)
    assert log.count("database unreachable") == 1, log
    assert "database reachable after" in log and "Traceback" not in log


def test_jobs_of_a_claim_whose_answer_was_lost_are_handed_back(server, processes):
    """A claim can commit and its answer be lost with the connection. The rows then say
    `processing` by this (live, heartbeating) worker although nothing runs them; the worker
    must notice after the failure and hand them back, while keeping the jobs it does run."""
    url = server.url
    proc = processes.worker(worker_env(url, WORKER_LOG_LEVEL="INFO"), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    (worker_id,) = query(url, "SELECT id FROM worker.workers WHERE pid = %s", (proc.pid,))[0]
    running = insert_job(url, "chaos_sync", '{"sleep": 4}')
    wait_until(lambda: status(url, running) == "processing", 30, "the real job to start")
    # What a lost claim leaves behind: rows claimed for this worker that it never received.
    lost = [
        insert_job(url, "echo", "{}", status="processing", worker_id=worker_id) for _ in range(3)
    ]

    server.stop()
    time.sleep(2)
    server.start()

    for job_id in lost:
        wait_until(lambda j=job_id: status(url, j) == "completed", 60, f"lost job {job_id}")
    wait_until(lambda: status(url, running) == "completed", 60, "the real job")
    assert effects(url, running) == 1, "a job the worker was running was handed back"
    assert job(url, running)["retry_count"] == 0
    assert all(job(url, j)["retry_count"] == 0 for j in lost)  # not counted as an attempt
    assert "3 jobs held by this worker but not run here" in processes.log(proc)


def test_terminated_sessions_do_not_stop_the_worker(database_url, processes):
    url = database_url
    proc = processes.worker(worker_env(url, PGAPPNAME="outage-victim"), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    running = insert_job(url, "hold_still", '{"sleep": 3}')
    wait_until(lambda: status(url, running) == "processing", 30, "the job to start")
    wait_until(
        lambda: query(
            url,
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'outage-victim' AND query LIKE 'LISTEN%'",
        )[0][0],
        30,
        "the listener",
    )
    killed = query(
        url,
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'outage-victim'",
    )[0][0]
    assert killed >= 2  # the pool and the listener at least
    after = insert_job(url, "echo", '{"b": 2}')
    wait_until(lambda: status(url, running) == "completed", 30, "the running job")
    wait_until(lambda: status(url, after) == "completed", 30, "a job enqueued after")
    assert job(url, running)["retry_count"] == 0
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_job_rescued_while_its_worker_still_runs_it_is_not_run_twice_at_once(
    database_url, processes
):
    """A worker that missed its lease (a stalled event loop) is presumed dead and its job goes
    back to pending while the attempt still runs. The worker, registered again, must not start
    the job a second time before that attempt ends, and the attempt's result no longer counts."""
    url = database_url
    query(url, EFFECTS)
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    job_id = insert_job(url, "timed_attempt", '{"sleep": 3}')
    attempts = "SELECT kind, attempt FROM chaos_effects WHERE job = %s ORDER BY at"
    wait_until(lambda: query(url, attempts, (job_id,)) == [("start", 1)], 30, "attempt 1")
    # What `sql.RESCUE` does to the jobs of a worker silent for a lease; the worker wakes at once.
    query(
        url,
        "UPDATE worker.jobs SET status = 'pending', retry_count = retry_count + 1, "
        "run_at = now() WHERE id = %s RETURNING pg_notify('worker_jobs', queue)",
        (job_id,),
    )
    wait_until(lambda: status(url, job_id) == "completed", 60, "the job to complete")
    assert query(url, attempts, (job_id,)) == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert job(url, job_id)["result"] == 2, "the result is the second attempt's"
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


# -- bounds -----------------------------------------------------------------------------------


def test_async_task_past_its_timeout_is_retried_then_failed_with_a_clear_error(
    database_url, processes
):
    url = database_url
    processes.worker(worker_env(url), TASKS)
    job_id = insert_job(url, "slow_async", '{"sleep": 30}', max_retries=1)
    wait_until(lambda: status(url, job_id) == "failed", 60, "the job to fail")
    done = job(url, job_id)
    assert done["retry_count"] == 1  # one retry, then failed
    assert "ran past its timeout" in str(done["error"])
    assert (done["finished"] - done["started"]).total_seconds() < 10  # type: ignore[operator]


def test_threads_a_task_started_are_told_when_its_attempt_ends(database_url, processes):
    url = database_url
    query(url, EFFECTS)
    processes.worker(worker_env(url), TASKS)
    job_id = insert_job(url, "hands_off_to_a_thread", "{}", max_retries=0)
    wait_until(lambda: status(url, job_id) == "failed", 60, "the job to time out")
    told = "SELECT kind FROM chaos_effects WHERE job = %s"
    wait_until(lambda: query(url, told, (job_id,)) != [], 10, "the helper to stop")
    assert query(url, told, (job_id,)) == [("helper told",)]


def test_a_tasks_own_timeout_error_is_not_reported_as_its_timeout(database_url, processes):
    url = database_url
    processes.worker(worker_env(url), TASKS)
    job_id = insert_job(url, "upstream_timeout", "{}", max_retries=0)
    wait_until(lambda: status(url, job_id) == "failed", 60, "the job to fail")
    error = str(job(url, job_id)["error"])
    assert "TimeoutError: the upstream did not answer" in error
    assert "ran past its timeout" not in error


def test_worker_task_timeout_setting_applies_to_tasks_without_their_own(database_url, processes):
    url = database_url
    processes.worker(worker_env(url, WORKER_TASK_TIMEOUT="1"), TASKS)
    job_id = insert_job(url, "default_timeout_sync", '{"sleep": 3}', max_retries=0)
    wait_until(lambda: status(url, job_id) == "failed", 60, "the job to fail")
    assert "ran past its timeout" in str(job(url, job_id)["error"])


def test_stuck_sync_task_is_reported_and_keeps_its_slot_until_it_returns(database_url, processes):
    url = database_url
    query(url, EFFECTS)
    proc = processes.worker(worker_env(url, WORKER_CONCURRENCY="1", WORKER_LOG_LEVEL="INFO"), TASKS)
    stuck = insert_job(url, "stuck_sync", '{"sleep": 5}', max_retries=0)
    wait_until(lambda: status(url, stuck) == "failed", 60, "the stuck job to time out")
    failed_at = time.monotonic()
    waiting = insert_job(url, "echo", "{}")
    wait_until(lambda: status(url, waiting) == "completed", 60, "the next job")
    waited = time.monotonic() - failed_at

    log = processes.log(proc)
    assert "ran past its timeout" in str(job(url, stuck)["error"])
    assert "ignores the cancel and still runs; it keeps its slot" in log
    assert "its abandoned thread returned at last; slot free again" in log
    # The only slot stayed taken until the thread returned (5 s after start, 1 s timeout).
    assert waited > 2.5, f"the next job started {waited:.1f} s after the timeout"
    assert effects(url, stuck) == 1  # the thread did finish its work, late


def test_connection_pool_is_capped_whatever_the_concurrency(database_url, processes):
    assert [pool_size(c) for c in (1, 10, 26, 1000)] == [4, 8, 16, POOL_CAP]
    url = database_url
    processes.worker(worker_env(url, WORKER_CONCURRENCY="200"), TASKS)
    query(
        url,
        "INSERT INTO worker.jobs (task, payload) "
        "SELECT 'hold_still', '{\"sleep\": 6}' FROM generate_series(1, 200)",
    )
    wait_until(
        lambda: (
            query(url, "SELECT count(*) FROM worker.jobs WHERE status = 'processing'")[0][0] == 200
        ),
        60,
        "all 200 jobs to run at once",
    )
    (pool_connections,) = query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'durable-worker'",
    )[0]
    assert 1 <= pool_connections <= POOL_CAP
    wait_until(
        lambda: (
            query(url, "SELECT count(*) FROM worker.jobs WHERE status = 'completed'")[0][0] == 200
        ),
        60,
        "the jobs to finish",
    )


def test_row_locked_by_another_client_does_not_hold_up_other_jobs_outcomes(database_url, processes):
    """An operator's open transaction holding one running job's row must not stop the worker
    recording every other job: that one outcome waits for the lock, the others go on."""
    url = database_url
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    held = insert_job(url, "hold_still", '{"sleep": 2}')
    wait_until(lambda: status(url, held) == "processing", 30, "the job to start")
    with psycopg.connect(url) as operator:  # not autocommit: the transaction stays open
        operator.execute("SELECT 1 FROM worker.jobs WHERE id = %s FOR UPDATE", (held,))
        time.sleep(2.5)  # the job ends meanwhile, and its outcome meets the lock
        others = [insert_job(url, "echo", '{"n": 1}') for _ in range(3)]
        wait_until(lambda: all(status(url, o) == "completed" for o in others), 30, "the other jobs")
        assert status(url, held) == "processing"
        operator.rollback()
    wait_until(lambda: status(url, held) == "completed", 30, "the held job, once unlocked")
    assert "is locked by another client" in processes.log(proc)
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_rows_locked_by_another_client_do_not_hold_up_other_jobs_stages(database_url, processes):
    """Stage writes of jobs whose rows an open transaction holds wait for it; those of other
    jobs go on. Three locked jobs finishing a stage a moment apart once tied up every writer."""
    url = database_url
    query(url, EFFECTS)
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    held = []
    for _ in range(3):
        held.append(insert_job(url, "chaos_pipeline", '{"sleep": 4}'))  # each stage sleeps 2 s
        time.sleep(0.5)
    wait_until(lambda: all(status(url, j) == "processing" for j in held), 30, "the jobs")
    fetch_done = "SELECT count(*) FROM worker.job_stages WHERE stage = 'fetch' AND job_id = %s "
    fetch_done += "AND status = 'completed'"
    with psycopg.connect(url) as operator:  # not autocommit: the transaction stays open
        operator.execute("SELECT 1 FROM worker.jobs WHERE id = ANY(%s::uuid[]) FOR UPDATE", (held,))
        wait_until(
            lambda: (
                query(url, "SELECT count(*) FROM chaos_effects WHERE kind = 'stage:fetch'")
                == [(3,)]
            ),
            30,
            "the locked jobs' first stage to end",
        )
        time.sleep(0.5)
        other = insert_job(url, "chaos_pipeline", '{"sleep": 0}')
        wait_until(lambda: status(url, other) == "completed", 30, "a job whose row is free")
        assert all(query(url, fetch_done, (j,)) == [(0,)] for j in held)
        operator.rollback()
    for j in held:
        wait_until(lambda j=j: status(url, j) == "completed", 30, "the locked jobs, once free")
    assert "is locked by another client" in processes.log(proc)
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_events_reporting_an_end_are_published_only_once_it_is_written(database_url, processes):
    """A stream must not show a stage (or the job) completed while the database does not:
    events reporting a stage end or the job's outcome follow the write that records it. Here
    that write waits for another client's lock (one that lets event rows in)."""
    url = database_url
    query(url, EFFECTS)
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: registered(url, proc), 60, "the worker to register")
    job_id = insert_job(url, "chaos_pipeline", '{"sleep": 3}')  # each stage sleeps 1.5 s
    stage = "SELECT status FROM worker.job_stages WHERE job_id = %s AND stage = %s"
    wait_until(lambda: query(url, stage, (job_id, "store")) == [("running",)], 30, "store")
    events = "SELECT step, status FROM worker.job_events WHERE job_id = %s ORDER BY id"
    with psycopg.connect(url) as operator:  # not autocommit: the transaction stays open
        operator.execute("SELECT 1 FROM worker.jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,))
        effects_of = "SELECT count(*) FROM chaos_effects WHERE job = %s AND kind = 'stage:store'"
        wait_until(lambda: query(url, effects_of, (job_id,)) == [(1,)], 30, "store to end")
        time.sleep(1.0)  # events are written every 50 ms
        seen = query(url, events, (job_id,))
        assert ("store", "started") in seen, seen  # events do get through the lock
        assert ("store", "completed") not in seen and ("job", "completed") not in seen, seen
        assert query(url, stage, (job_id, "store")) == [("running",)]
        operator.rollback()
    wait_until(lambda: status(url, job_id) == "completed", 30, "the job, once unlocked")
    wait_until(
        lambda: (
            {("store", "completed"), ("job", "completed")} <= set(query(url, events, (job_id,)))
        ),
        30,
        "the events reporting its end",
    )
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_no_transaction_or_row_lock_is_held_while_a_slow_task_runs(database_url, processes):
    url = database_url
    processes.worker(worker_env(url), TASKS)
    job_id = insert_job(url, "hold_still", '{"sleep": 4}')
    wait_until(lambda: status(url, job_id) == "processing", 30, "the job to start")
    time.sleep(1)
    sessions = query(
        url,
        "SELECT state, count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'durable-worker%%' GROUP BY state",
    )
    assert sessions, "no worker session found"
    assert "idle in transaction" not in {s for s, _ in sessions}, sessions
    with psycopg.connect(url) as conn:  # NOWAIT: fails at once if the worker held the row
        locked = conn.execute(
            "SELECT status FROM worker.jobs WHERE id = %s FOR UPDATE NOWAIT", (job_id,)
        ).fetchall()
        conn.rollback()
    assert locked == [("processing",)]
    wait_until(lambda: status(url, job_id) == "completed", 30, "the job to finish")
