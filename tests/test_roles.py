"""Least privilege and secrets.

Migration 0003 creates two NOLOGIN roles: `worker_client` (enqueue, read status) and
`worker_runner` (run jobs). A login role granted the first can enqueue and read but not change
a job; one granted the second runs a real worker end to end. Passwords in `DATABASE_URL` and
the API token never show in a worker's log or an error line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from chaos.harness import OwnServer, wait_until, worker_env
from psycopg import sql as pgsql
from support import Processes, query
from support.factories import claim_params

from worker import Client
from worker.db import migrate, sql

TASKS = "chaos.faulttasks"


def as_user(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest.split('@', 1)[1]}"


@pytest.fixture
def login_role(database_url: str) -> Iterator[Callable[[str], str]]:
    """`login_role("worker_client")`: a new login role in that group; returns its URL."""
    made: list[str] = []

    def make(group: str) -> str:
        name, password = f"t_{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
        query(
            database_url,
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                pgsql.Identifier(name), pgsql.Literal(password), pgsql.Identifier(group)
            ),
        )
        made.append(name)
        return as_user(database_url, name, password)

    yield make
    for name in made:
        query(database_url, pgsql.SQL("DROP OWNED BY {0}").format(pgsql.Identifier(name)))
        query(database_url, pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


def refused(url: str, statement: str, params: dict[str, object] | None = None) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query(url, statement, params)


def test_migration_creates_the_two_roles_without_login(database_url):
    rows = query(
        database_url,
        "SELECT rolname, rolcanlogin, rolsuper, rolcreaterole FROM pg_roles "
        "WHERE rolname IN ('worker_client', 'worker_runner') ORDER BY rolname",
    )
    assert rows == [
        ("worker_client", False, False, False),
        ("worker_runner", False, False, False),
    ]


def test_client_role_may_enqueue_and_read_but_not_change_jobs(database_url, login_role):
    url = login_role("worker_client")
    client = Client(url)
    job = client.enqueue("echo", {"a": 1})
    assert client.get(job.job_id).status == "pending"
    query(url, "SELECT worker.enqueue('echo', '{\"b\": 2}')")
    query(url, "INSERT INTO worker.jobs (task) VALUES ('echo')")
    assert query(url, "SELECT pending FROM worker.queue_stats") == [(3,)]
    query(url, "SELECT count(*) FROM worker.job_events")

    params = {"id": job.job_id}
    refused(url, "UPDATE worker.jobs SET status = 'completed' WHERE id = %(id)s", params)
    refused(url, "DELETE FROM worker.jobs WHERE id = %(id)s", params)
    refused(url, sql.CANCEL, params)
    refused(url, sql.RETRY, params)
    refused(
        url,
        sql.CLAIM,
        claim_params(uuid.uuid4(), ["echo"], limit=1),
    )
    refused(
        url,
        "INSERT INTO worker.workers (id, hostname, pid, queues, concurrency) "
        "VALUES (gen_random_uuid(), 'h', 1, '{default}', 1)",
    )
    refused(url, "CREATE TABLE worker.sneaky (id int)")
    assert query(database_url, "SELECT count(*) FROM worker.jobs WHERE status = 'pending'") == [
        (3,)
    ]
    # From the command line: said as it is, not taken for a missing schema.
    done = subprocess.run(
        [sys.executable, "-m", "worker", "cancel", job.job_id],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "the database role may not do this: permission denied" in done.stderr
    assert "Traceback" not in done.stderr


def test_runner_role_runs_a_real_worker(database_url, login_role, processes: Processes):
    runner, client = login_role("worker_runner"), login_role("worker_client")
    runner_name = runner.split("://", 1)[1].split(":", 1)[0]
    query(
        database_url,
        "CREATE TABLE chaos_effects (job uuid, kind text, attempt int, pid int, value float8, "
        "at timestamptz DEFAULT clock_timestamp())",
    )
    query(
        database_url,
        pgsql.SQL("GRANT INSERT ON chaos_effects TO {}").format(pgsql.Identifier(runner_name)),
    )
    jobs = Client(client)
    ids = [
        jobs.enqueue("echo", {"a": 1}).job_id,
        jobs.enqueue("chaos_pipeline", {"n": 1}).job_id,  # stages and an ALL_DONE cleanup
        jobs.enqueue("chatty", {"events": 20}).job_id,  # progress events
    ]
    proc = processes.worker(worker_env(runner, WORKER_LOG_LEVEL="INFO"), TASKS)
    wait_until(
        lambda: (
            query(client, "SELECT count(*) FROM worker.jobs WHERE status = 'completed'")[0][0] == 3
        ),
        60,
        "the runner to complete every job",
    )
    wait_until(
        lambda: query(client, "SELECT count(*) FROM worker.job_events")[0][0] >= 20,
        30,
        "the progress events",
    )
    stages = query(
        client,
        "SELECT stage, status FROM worker.job_stages WHERE job_id = %s ORDER BY 1",
        (ids[1],),
    )
    assert stages == [("fetch", "completed"), ("release", "completed"), ("store", "completed")]
    # The runner's other duties: rescue and retention.
    query(runner, sql.RESCUE, {"lease": 3600, "grace": 1.0, "starting": False})
    later = datetime.now(UTC) + timedelta(days=1)
    query(runner, sql.PRUNE_BATCH, {"statuses": ["completed"], "before": later, "batch": 100})
    assert query(client, "SELECT count(*) FROM worker.jobs") == [(0,)]
    # Their stages and events went with them, though the runner may not delete those itself.
    assert query(client, "SELECT count(*) FROM worker.job_stages") == [(0,)]
    assert query(client, "SELECT count(*) FROM worker.job_events") == [(0,)]
    refused(runner, "CREATE TABLE worker.sneaky (id int)")
    refused(runner, "DROP TABLE worker.jobs")
    log = processes.log(proc)
    assert "permission denied" not in log and "Traceback" not in log, log


def test_the_runner_may_pause_and_limit_queues_and_the_client_only_read_them(login_role):
    runner, client = Client(login_role("worker_runner")), login_role("worker_client")
    runner.pause_queue("mail")
    limited = runner.limit_queue("mail", concurrency=2, rate=3)
    assert (limited.paused, limited.concurrency, limited.rate) == (True, 2, 3.0)
    assert Client(client).queue("mail").paused
    refused(client, "UPDATE worker.queues SET paused = false")
    refused(client, "INSERT INTO worker.queues (name) VALUES ('other')")


def test_migration_by_a_user_who_may_not_create_roles_still_succeeds():
    """On a server without the roles, an owner without CREATEROLE migrates anyway (NOTICE);
    a DBA creates the roles later and applies the grants with one call."""
    server = OwnServer()  # a fresh server: roles are server-wide
    try:
        admin = server.url.rsplit("/", 1)[0] + "/postgres"
        for role in ("worker_client", "worker_runner"):
            query(server.url, f"REVOKE ALL ON ALL TABLES IN SCHEMA worker FROM {role}")
            query(server.url, f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA worker FROM {role}")
            query(server.url, f"REVOKE ALL ON SCHEMA worker FROM {role}")
            query(server.url, f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA worker FROM {role}")
        query(server.url, "DROP ROLE worker_client, worker_runner")
        query(admin, "CREATE ROLE app_owner LOGIN NOCREATEROLE")
        query(admin, "CREATE DATABASE app OWNER app_owner")
        owner_url = as_user(admin, "app_owner", "pw").rsplit("/", 1)[0] + "/app"

        migrate.upgrade(owner_url)
        assert query(owner_url, "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'worker_%%'") == [
            (0,)
        ]
        assert query(owner_url, "SELECT worker.grant_roles()") == [("no role to grant to",)]

        query(admin, "CREATE ROLE worker_client NOLOGIN")
        query(admin, "CREATE ROLE worker_runner NOLOGIN")
        assert query(owner_url, "SELECT worker.grant_roles()") == [
            ("granted to worker_client, worker_runner",)
        ]
        assert query(
            owner_url,
            "SELECT has_table_privilege('worker_client', 'worker.jobs', 'INSERT'), "
            "has_table_privilege('worker_client', 'worker.jobs', 'UPDATE'), "
            "has_table_privilege('worker_runner', 'worker.jobs', 'UPDATE')",
        ) == [(True, False, True)]
    finally:
        server.destroy()


# -- secrets ----------------------------------------------------------------------------------


def test_passwords_and_the_api_token_never_reach_the_worker_log(database_url, processes):
    password, token = f"pw-{uuid.uuid4().hex}", f"tok-{uuid.uuid4().hex}"
    url = as_user(database_url, "postgres", password)
    procs = [
        processes.worker(
            worker_env(
                url,
                WORKER_LOG_LEVEL="DEBUG",
                WORKER_LOG_FORMAT=fmt,
                WORKER_API_TOKEN=token,
                PGAPPNAME=f"secret-{fmt}",
            ),
            TASKS,
        )
        for fmt in ("text", "json")
    ]
    failing = query(
        database_url,
        "INSERT INTO worker.jobs (task, max_retries) VALUES ('raises_nul', 0) RETURNING id",
    )
    wait_until(
        lambda: (
            query(database_url, "SELECT count(*) FROM worker.jobs WHERE status = 'failed'")[0][0]
            == len(failing)
        ),
        60,
        "the failing jobs",
    )
    # An outage: every session of both workers is cut, so they log their reconnection.
    wait_until(
        lambda: (
            query(
                database_url,
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE application_name LIKE 'secret-%' AND query LIKE 'LISTEN%'",
            )[0][0]
            == 2
        ),
        30,
        "both workers to listen",
    )
    query(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name LIKE 'secret-%'",
    )
    for proc in procs:
        wait_until(
            lambda p=proc: "listener reconnected" in processes.log(p), 60, "the reconnection"
        )
    for proc in procs:
        log = processes.log(proc)
        assert password not in log and token not in log, log


def test_cli_error_line_hides_the_password(env):
    password = f"pw-{uuid.uuid4().hex}"
    url = f"postgresql://app:{password}@127.0.0.1:9/app"  # nothing listens on port 9
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "enqueue", "echo"],
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach the database" in lines[0], proc.stderr
    assert password not in proc.stderr + proc.stdout
