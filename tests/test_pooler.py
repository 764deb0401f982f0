"""Behind PgBouncer in transaction mode: workers and clients keep no session state, and the
workers find their jobs by notification from a direct `WORKER_LISTEN_URL`, or by polling.

Every test here runs real `worker run` processes through a real PgBouncer (see
`support.pooler`) in front of the test's own database.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from chaos.harness import OwnServer
from support import (
    Processes,
    effects,
    query,
    status_of,
    wait_for,
    wait_for_status,
    worker_env,
)
from support.pooler import MISSING, PGBOUNCER, PgBouncer, fleet_command
from support.servers import ServerLog

from worker import Client, JobStatus, Workflow
from worker.daemon.db import Patience
from worker.db import admin
from worker.db.connect import PoolerMismatch
from worker.settings import get_settings

pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason=MISSING)

POLLING_LINE = "no notifications behind a transaction pooler"
# What a server session may carry that PgBouncer itself sets for each client (the startup
# parameters it tracks), not the worker.
POOLER_PARAMETERS = {"application_name", "client_encoding", "DateStyle", "TimeZone"}


@pytest.fixture
def bouncer(database_url: str, tmp_path: Path) -> Iterator[PgBouncer]:
    with PgBouncer(database_url, tmp_path, pool_size=4) as running:
        yield running


@pytest.fixture
def pooled_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's settings say `DATABASE_POOLER=transaction`, with no listen URL."""
    monkeypatch.setenv("DATABASE_POOLER", "transaction")
    monkeypatch.delenv("WORKER_LISTEN_URL", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()  # the next test reads its own settings


@pytest.fixture
def pooled_client(bouncer: PgBouncer, pooled_settings: None) -> Iterator[Client]:
    """A client of this process through the pooler."""
    client = Client(bouncer.url)
    try:
        yield client
    finally:
        client.close()


def pooled_env(env: dict[str, str], bouncer: PgBouncer, **settings: str) -> dict[str, str]:
    return {**env, "DATABASE_URL": bouncer.url, "DATABASE_POOLER": "transaction", **settings}


def each_server_session(bouncer: PgBouncer, sessions: int, statement: str) -> list[list[tuple]]:
    """Run `statement` on `sessions` server sessions of the pool at once (each pooled
    connection holds its own in a transaction), and return each one's rows."""
    conns = [psycopg.connect(bouncer.url, prepare_threshold=None) for _ in range(sessions)]
    try:
        return [conn.execute(statement).fetchall() for conn in conns]
    finally:
        for conn in conns:
            conn.rollback()  # a session left in a transaction is closed, not pooled again
            conn.close()


def completed(url: str) -> int:
    return int(query(url, "SELECT count(*) FROM worker.jobs WHERE status = 'completed'")[0][0])


def ran_once(url: str, ids: list[str]) -> list[str]:
    """The jobs among `ids` whose task did not run exactly once."""
    return [job_id for job_id in ids if effects(url, job_id) != ["effect"]]


def stop(processes: Processes, timeout: float = 20) -> None:
    for proc in processes.procs:
        proc.terminate()
    for proc in processes.procs:
        assert proc.wait(timeout) == 0, processes.log(proc)


def test_workers_and_a_client_behind_pgbouncer_run_every_job_once_by_polling(
    env, database_url, bouncer, pooled_client, processes
):
    for _ in range(4):
        processes.worker(pooled_env(env, bouncer, WORKER_CONCURRENCY="4"), "testtasks")
    ids = [pooled_client.enqueue("effect", {"key": f"k{i}"}).job_id for i in range(100)]
    many = [("effect", {"key": f"m{i}"}) for i in range(100)]
    ids += [job.job_id for job in pooled_client.enqueue_many(many)]
    wait_for(lambda: completed(database_url) == 200, timeout=60, message="200 jobs completed")
    assert ran_once(database_url, [f"{k}{i}" for k in "km" for i in range(100)]) == []
    assert pooled_client.get(ids[0]).status is JobStatus.COMPLETED
    assert pooled_client.enqueue("add", {"a": 2, "b": 3}).wait_sync(timeout=30) == 5
    stop(processes)
    for proc in processes.procs:
        log = processes.log(proc)
        assert "Traceback" not in log, log
        assert log.count(POLLING_LINE) == 1, log


def test_no_setting_nor_prepared_statement_of_a_worker_reaches_another_client_of_the_pool(
    env, database_url, bouncer, pooled_client, processes
):
    processes.worker(pooled_env(env, bouncer), "testtasks")
    for n in range(30):  # claims, outcomes, heartbeats: every statement the worker sends
        pooled_client.enqueue("add", {"a": n, "b": 1})
    wait_for(lambda: completed(database_url) == 30, message="30 jobs completed")
    # The metrics' stuck-jobs count sets its lease (`worker.lease_seconds`) too.
    assert admin.blocking(bouncer.url, "test", lambda c: admin.stuck_by_queue(c, 42.0)) == []
    rows = each_server_session(
        bouncer,
        4,
        "SELECT name, setting FROM pg_settings WHERE source = 'session' "
        "UNION ALL SELECT 'prepared: ' || name, statement FROM pg_prepared_statements",
    )
    leaked = [row for session in rows for row in session if row[0] not in POOLER_PARAMETERS]
    assert leaked == []
    # pg_settings lists no custom setting: the one the product makes is asked for by name.
    lease = each_server_session(bouncer, 4, "SELECT current_setting('worker.lease_seconds', true)")
    assert all(value in (None, "") for [(value,)] in lease), lease
    plans = each_server_session(bouncer, 4, "SHOW plan_cache_mode")
    assert plans == [[("auto",)]] * 4


def test_a_workflow_behind_pgbouncer_completes_and_a_retry_re_arms_it(
    env, database_url, bouncer, pooled_client, processes
):
    for _ in range(2):
        processes.worker(pooled_env(env, bouncer, WORKER_CONCURRENCY="4"), "workflowtasks")
    wf = Workflow("export")
    tables = [wf.add("part", {"n": n}, name=f"export_{n}") for n in range(12)]
    flaky = wf.add("flaky", {"n": 12}, name="flaky", max_retries=0)
    verify = wf.add("fan_in", {}, name="verify", after=[*tables, flaky])
    wf.add("finalize", {}, name="clean_up", after=[verify], on_parent_failure="run")
    handle = wf.enqueue(client=pooled_client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    wait_for(lambda: handle.status()[JobStatus.COMPLETED] == 13, message="the exports and clean_up")
    assert handle.status()[JobStatus.CANCELLED] == 1
    query(database_url, "INSERT INTO effects (job, kind) VALUES (%s, 'fix')", (ids["flaky"],))
    pooled_client.retry(ids["flaky"])
    wait_for(lambda: status_of(database_url, ids["verify"]) == "completed", message="verify")
    assert effects(database_url, ids["verify"]) == ["ran:0"]
    result = "SELECT result FROM worker.jobs WHERE id = %s"
    assert query(database_url, result, (ids["verify"],))[0][0]["sum"] == sum(range(13))
    # The settling functions' mark is the transaction's own: no session of the pool keeps it.
    settling = each_server_session(bouncer, 4, "SELECT current_setting('worker.settling', true)")
    assert all(value in (None, "") for [(value,)] in settling), settling


def test_worker_migrate_through_pgbouncer_leaves_nothing_on_the_pool(empty_database_url, tmp_path):
    with PgBouncer(empty_database_url, tmp_path, pool_size=1) as one_session:
        env = worker_env(one_session.url, DATABASE_POOLER="transaction")
        migrate = [sys.executable, "-m", "worker", "migrate"]
        done = subprocess.run(migrate, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert query(empty_database_url, "SELECT to_regclass('worker.jobs') IS NOT NULL") == [
            (True,)
        ]
        [left] = each_server_session(
            one_session,
            1,
            "SELECT name FROM pg_settings WHERE source = 'session' "
            "UNION ALL SELECT name FROM pg_prepared_statements",
        )
        assert [name for (name,) in left if name not in POOLER_PARAMETERS] == []


def test_with_a_listen_url_an_idle_worker_behind_pgbouncer_is_woken_by_notification(
    env, database_url, bouncer, pooled_client, processes
):
    # Polls a minute apart: a job that starts within seconds was woken by its notification.
    settings = {"WORKER_POLL_MIN": "60", "WORKER_POLL_MAX": "60", "WORKER_LISTEN_URL": database_url}
    proc = processes.worker(pooled_env(env, bouncer, **settings), "testtasks")
    pooled_client.enqueue("add", {"a": 1, "b": 1})
    wait_for(lambda: completed(database_url) == 1, message="the first job completed")
    time.sleep(1.0)  # the claim loop is idle, its next poll a minute away
    latencies = []
    for n in range(5):
        job = pooled_client.enqueue("add", {"a": n, "b": 1})
        wait_for_status(database_url, job.job_id, "completed", timeout=10)
        ((latency,),) = query(
            database_url,
            "SELECT extract(epoch FROM started_at - created_at) FROM worker.jobs WHERE id = %s",
            (job.job_id,),
        )
        latencies.append(float(latency))
        time.sleep(0.5)
    assert max(latencies) < 5, latencies
    assert POLLING_LINE not in processes.log(proc)
    # The worker's LISTEN session is the direct one, not a server session of the pool.
    listening = query(
        database_url,
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
        "AND application_name = 'durable-worker-listener'",
    )
    assert listening == [(1,)]


@pytest.mark.chaos
def test_forty_worker_processes_share_twenty_server_sessions_and_run_every_job_once(
    env, database_url, tmp_path, pooled_settings, processes
):
    with PgBouncer(database_url, tmp_path, pool_size=20) as twenty:
        # A long lease: 40 processes starting on a small machine must not miss heartbeats.
        settings = {"WORKER_CONCURRENCY": "2", "WORKER_LEASE_SECONDS": "60"}
        log = open(tmp_path / "fleet.log", "wb")  # noqa: SIM115 - the fleet's, read below
        fleet = subprocess.Popen(
            fleet_command(40, "testtasks"),
            env=pooled_env(env, twenty, **settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
        fleet.log_path = log.name  # type: ignore[attr-defined]
        processes.procs.append(fleet)  # killed with its workers if the test fails
        wait_for(
            lambda: query(database_url, "SELECT count(*) FROM worker.workers") == [(40,)],
            timeout=120,
            message="40 workers registered",
        )
        client = Client(twenty.url)
        try:
            client.enqueue_many([("effect", {"key": f"j{i}"}) for i in range(400)])
        finally:
            client.close()
        sessions, waited = [], []

        def drained() -> bool:
            sessions.append(server_sessions(database_url))
            waited.extend(float(p["maxwait"]) for p in twenty.stats("SHOW POOLS"))
            return completed(database_url) == 400

        wait_for(drained, timeout=120, interval=0.2, message="400 jobs completed")
        assert ran_once(database_url, [f"j{i}" for i in range(400)]) == []
        assert max(sessions) <= 20
        assert max(waited) < 5  # no client waited long for a server session
        stop(processes, timeout=90)
        assert "Traceback" not in processes.log(fleet)
        assert processes.log(fleet).count(" started: queues default") == 40


def server_sessions(url: str) -> int:
    """Sessions on the test's database other than this one: PgBouncer's server sessions."""
    rows = query(
        url,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return int(rows[0][0])


def test_a_worker_behind_an_undeclared_transaction_pooler_refuses_to_start_in_one_line(
    env, bouncer, processes
):
    proc = processes.worker({**env, "DATABASE_URL": bouncer.url}, "testtasks")
    assert proc.wait(30) == 1
    log = processes.log(proc)
    assert "Traceback" not in log, log
    (line,) = [line for line in log.splitlines() if "DATABASE_POOLER" in line]
    assert "set DATABASE_POOLER=transaction" in line


@pytest.fixture(scope="module")
def own_server() -> Iterator[OwnServer]:
    """A PostgreSQL of this module's own: its log holds only what these tests' clients did."""
    own = OwnServer()
    yield own
    own.destroy()


@pytest.mark.parametrize("route", ["direct", "undeclared pooler", "declared pooler"])
def test_the_pooler_check_of_a_starting_worker_leaves_no_error_in_the_servers_log(
    own_server, route, tmp_path, processes
):
    # Log-based alerting reads every ERROR line: a worker's start must write none, whether the
    # check finds a pooler (the worker refuses to start) or not, and where it does not run.
    log = ServerLog(own_server.pg)
    with PgBouncer(own_server.url, tmp_path, pool_size=4) as bouncer:
        url = own_server.url if route == "direct" else bouncer.url
        pooler = "transaction" if route == "declared pooler" else "none"
        env = worker_env(url, DATABASE_POOLER=pooler, WORKER_DATA_DIR=str(tmp_path / "data"))
        proc = processes.worker(env, "testtasks")
        if route == "undeclared pooler":
            assert proc.wait(30) == 1
            assert "set DATABASE_POOLER=transaction" in processes.log(proc)
        else:
            wait_for(
                lambda: " started: queues " in processes.log(proc),
                timeout=30,
                message="the worker started",
            )
    assert log.errors() == []


def test_a_client_behind_an_undeclared_transaction_pooler_fails_saying_so(database_url, tmp_path):
    get_settings.cache_clear()
    with PgBouncer(database_url, tmp_path, pool_size=1) as one_session:
        clients = [Client(one_session.url), Client(one_session.url)]
        try:
            clients[0].enqueue("add", {"a": 1, "b": 2})  # prepared on the one server session
            with pytest.raises(PoolerMismatch, match="set DATABASE_POOLER=transaction"):
                clients[1].enqueue("add", {"a": 1, "b": 2})  # the same name, the same session
        finally:
            for client in clients:
                client.close()


def test_a_clash_of_prepared_statements_in_the_daemon_is_named_not_retried():
    tries = []

    async def clashing() -> None:
        tries.append(1)
        raise psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" exists')

    async def confirm() -> None:
        pass

    patience = Patience(stopping=lambda: False, confirm=confirm)
    with pytest.raises(PoolerMismatch, match="set DATABASE_POOLER=transaction"):
        asyncio.run(patience.run("claiming", clashing))
    assert tries == [1]


@pytest.mark.parametrize(
    "form",
    [
        "postgresql://postgres@127.0.0.1:1,127.0.0.1:{port}/{db}?target_session_attrs=read-write",
        "postgresql://postgres@/{db}?host=127.0.0.1,127.0.0.1&port=1,{port}"
        "&target_session_attrs=read-write",
    ],
    ids=["hosts-in-netloc", "hosts-in-query"],
)
def test_a_multi_host_url_in_either_form_reaches_the_answering_host(database_url, form):
    server, db = database_url.rsplit("/", 1)
    url = form.format(port=server.rsplit(":", 1)[1], db=db)  # the first host refuses
    client = Client(url)
    try:
        job = client.enqueue("add", {"a": 1, "b": 2})  # the kept psycopg connection
        assert client.get(job.job_id).status is JobStatus.PENDING  # SQLAlchemy's engine
    finally:
        client.close()
