"""Bad settings stop the program at start: one line naming the variable, exit code 2."""

from __future__ import annotations

import doctest
import logging
import subprocess
import sys

import psycopg
import pytest
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from worker import urls
from worker.db.connect import connect_options, listen_url, pooled
from worker.db.notifier import Notifier
from worker.settings import Pooler, Settings, get_settings
from worker.urls import sqlalchemy_url

NETLOC_FORM = "postgresql://app:p%40ss@db1:5432,db2:5433/app?target_session_attrs=read-write"
QUERY_FORM = (
    "postgresql://app:p%40ss@/app?host=db1,db2&port=5432,5433&target_session_attrs=read-write"
)
BOTH_FORMS = pytest.mark.parametrize(
    "url", [NETLOC_FORM, QUERY_FORM], ids=["hosts-in-netloc", "hosts-in-query"]
)


def run_worker(env: dict[str, str], cwd: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "run", "testtasks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("WORKER_POLL_MIN", "-1", "WORKER_POLL_MIN"),
        ("WORKER_POLL_MAX", "abc", "WORKER_POLL_MAX"),
        ("WORKER_MAX_RETRIES", "-3", "WORKER_MAX_RETRIES"),
        ("WORKER_CONCURRENCY", "0", "WORKER_CONCURRENCY"),
        ("WORKER_LEASE_SECONDS", "0", "WORKER_LEASE_SECONDS"),
        ("WORKER_QUEUES", " , ", "WORKER_QUEUES"),
        ("DATABASE_URL", "mysql://root@localhost/app", "DATABASE_URL"),
        ("DATABASE_URL", "postgresql://u:secret@host:notaport/db", "DATABASE_URL"),
        ("DATABASE_URL", "postgresql://u:secret@db1:5432,db2:x/db", "DATABASE_URL"),
        ("DATABASE_URL", "postgresql://u:secret@/db?host=db1,db2&port=5432,x", "DATABASE_URL"),
        ("DATABASE_POOLER", "statement", "DATABASE_POOLER"),
        ("WORKER_LISTEN_URL", "postgresql://u:secret@host:notaport/db", "WORKER_LISTEN_URL"),
        ("WORKER_PIN_CPUS", "sometimes", "WORKER_PIN_CPUS"),
    ],
)
def test_invalid_setting_exits_2_naming_the_variable(tmp_path, variable, value, expected):
    env = {"PATH": "/usr/bin:/bin", variable: value, "WORKER_DATA_DIR": str(tmp_path)}
    proc = run_worker(env, tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert "secret" not in proc.stderr


def test_poll_min_greater_than_max_is_refused(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "WORKER_POLL_MIN": "5", "WORKER_POLL_MAX": "1"}
    proc = run_worker(env, tmp_path)
    assert proc.returncode == 2
    assert "WORKER_POLL_MIN must not be greater than WORKER_POLL_MAX" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_pinning_to_cpus_where_the_system_cannot_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.delattr("os.sched_setaffinity")
    with pytest.raises(ValidationError, match="WORKER_PIN_CPUS needs Linux"):
        Settings(WORKER_PIN_CPUS=True)
    assert Settings(WORKER_PIN_CPUS=False).pin_cpus is False


def test_settings_are_read_from_dotenv(tmp_path):
    (tmp_path / ".env").write_text("WORKER_CONCURRENCY=-4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "run", "testtasks"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "WORKER_CONCURRENCY" in proc.stderr


def test_a_dotenv_that_is_not_utf8_is_one_line_naming_the_file(tmp_path):
    (tmp_path / ".env").write_bytes(b"WORKER_CONCURRENCY=\xff\xfe4\n")
    proc = run_worker({"PATH": "/usr/bin:/bin", "WORKER_DATA_DIR": str(tmp_path)}, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: cannot read .env: it is not UTF-8 text"


@BOTH_FORMS
def test_both_forms_of_a_multi_host_url_are_accepted(url):
    assert Settings(DATABASE_URL=url, WORKER_LISTEN_URL=url).database_url == url


@BOTH_FORMS
def test_sqlalchemy_is_given_the_same_hosts_ports_and_options_as_libpq(url):
    libpq = conninfo_to_dict(url)
    alchemy = make_url(sqlalchemy_url(url))
    assert alchemy.query["host"] == libpq["host"] == "db1,db2"
    assert alchemy.query["port"] == libpq["port"] == "5432,5433"
    assert alchemy.query["target_session_attrs"] == "read-write"
    assert (alchemy.username, alchemy.password, alchemy.database) == ("app", "p@ss", "app")


@pytest.fixture
def pooler_settings(monkeypatch):
    def apply(**variables: str) -> None:
        for name in ("DATABASE_POOLER", "WORKER_LISTEN_URL"):
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    yield apply
    get_settings.cache_clear()


def test_nothing_is_prepared_behind_a_transaction_pooler(pooler_settings):
    url = "postgresql://app@pooler:6432/app"
    pooler_settings()
    assert not pooled()
    assert "prepare_threshold" not in connect_options(url, "test")
    pooler_settings(DATABASE_POOLER="transaction")
    assert get_settings().database_pooler is Pooler.TRANSACTION
    assert connect_options(url, "test")["prepare_threshold"] is None


def test_notifications_come_from_the_listen_url_or_not_at_all_behind_a_pooler(pooler_settings):
    url, direct = "postgresql://app@pooler:6432/app", "postgresql://app@db:5432/app"
    pooler_settings()
    assert listen_url(url) == url
    pooler_settings(DATABASE_POOLER="transaction")
    assert listen_url(url) is None
    pooler_settings(DATABASE_POOLER="transaction", WORKER_LISTEN_URL=direct)
    assert listen_url(url) == direct


def test_the_url_check_knows_every_option_libpq_takes_and_no_other():
    libpq = {d.keyword.decode() for d in pq.Conninfo.get_defaults()}
    assert urls.LIBPQ_OPTIONS - {"ssl"} == libpq


@pytest.mark.parametrize(
    "url",
    [
        NETLOC_FORM,
        QUERY_FORM,
        "postgresql://app@db/app?sslmode=require&application_name=a%20b",
        "postgresql://app@db/app?ssl=true",
        "postgresql://app@db/app?colour=blue",
        "postgresql://app@db/app?sslmode",
        "postgresql://app@db/app?sslmode=a=b",
        "postgresql://app:p%ZZ@db/app",
        "postgresql://app:p%4@db/app",
        "postgresql://app:p%00@db/app",
        "postgresql://app:100%@db/app",
    ],
)
def test_a_url_is_refused_at_start_exactly_when_libpq_would_refuse_it(url):
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        accepted = False
    else:
        accepted = True
    assert (urls.libpq_problem(url) is None) == accepted


def test_the_examples_in_the_url_module_hold():
    assert doctest.testmod(urls).failed == 0


def test_behind_a_pooler_without_listen_url_subscriptions_are_ready_at_once_and_never_block(
    pooler_settings, caplog
):
    pooler_settings(DATABASE_POOLER="transaction")
    listener = Notifier("postgresql://app@pooler:6432/app", "test-listener")
    with caplog.at_level(logging.INFO, logger="worker.notifier"):
        for _ in range(100_000):  # more than a pipe holds, were each close to poke the thread
            sub = listener.subscribe("worker_done", lambda payload: None)
            assert sub.ready.is_set()
            sub.close()
    assert listener._thread is None  # nothing listens through the pooler
    said = [r.getMessage() for r in caplog.records if r.name == "worker.notifier"]
    assert len(said) == 1 and said[0].startswith("no notifications behind a transaction pooler")
