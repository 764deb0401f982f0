"""Hostile and bad input: oversized and deeply nested payloads, absurd task names, bytes
PostgreSQL cannot store, rows out of range, bad settings, an unreachable database, task results
that are not JSON. Each is refused with a clear error naming the problem, or handled; none
crashes a worker or loses a job.

Documented limits: a payload is at most `WORKER_MAX_PAYLOAD_BYTES` (default 1,000,000) when
enqueued through the client; JSON nested deeper than about 1,000 levels cannot be decoded by
Python, so the client refuses it and a worker fails such a job (inserted by SQL) with a clear
error; a task name is 1 to 255 characters (a CHECK constraint).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest
from chaos.harness import wait_until, worker_env
from support import Processes, insert_job, query

from worker import Client, InvalidJob
from worker import task as register
from worker.settings import get_settings, load_settings_or_exit
from worker.testing import drain

TASKS = "chaos.faulttasks"


def deep(depth: int) -> dict[str, object]:
    value: object = []
    for _ in range(depth):
        value = [value]
    return {"deep": value}


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tempfile.gettempdir(),  # no stray .env file is read
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The program's error output: exactly one line, and no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def status_of(url: str, job_id: str) -> tuple[str, object, str | None]:
    row = query(url, "SELECT status, result, error FROM worker.jobs WHERE id = %s", (job_id,))[0]
    return str(row[0]), row[1], row[2]


# A bad input is the whole story of these jobs: they are never retried.
insert = functools.partial(insert_job, max_retries=0)


def finished(url: str, job_id: str) -> bool:
    return status_of(url, job_id)[0] in ("completed", "failed", "cancelled")


# -- payloads and task names ------------------------------------------------------------------


def test_ten_megabyte_payload_is_refused_by_the_client_naming_the_limit(database_url):
    with pytest.raises(InvalidJob, match=r"payload is 100000\d\d bytes; the limit is 1000000 "):
        Client(database_url).enqueue("echo", {"blob": "x" * 10_000_000})
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_payload_nested_ten_thousand_deep_is_refused_by_the_client(database_url):
    with pytest.raises(InvalidJob, match="nested too deeply"):
        Client(database_url).enqueue("echo", deep(10_000))
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_worker_handles_oversized_and_deeply_nested_payloads_inserted_by_sql(
    database_url, processes: Processes
):
    """SQL bypasses the client's checks. A 10 MB payload still runs; a payload nested 10,000
    deep (PostgreSQL accepts it) fails with a clear error instead of taking the worker down,
    and the jobs around it run normally."""
    url = database_url
    big = insert(url, "echo", json.dumps({"blob": "x" * 10_000_000}))
    deep = '{"deep": ' + "[" * 10_000 + "]" * 10_000 + "}"
    nested = insert(url, "echo", deep)
    nested_pipeline = insert(url, "chaos_pipeline", deep)
    after = insert(url, "echo", '{"a": 1, "b": 2}')
    proc = processes.worker(worker_env(url), TASKS)
    for job_id in (big, nested, nested_pipeline, after):
        wait_until(lambda j=job_id: finished(url, j), 60, f"job {job_id}")
    # The claim started the pipeline's first stage; it cannot run, and is not left running.
    assert status_of(url, nested_pipeline)[0] == "failed"
    stage = "SELECT stage, status FROM worker.job_stages WHERE job_id = %s"
    assert query(url, stage, (nested_pipeline,)) == [("fetch", "failed")]
    assert status_of(url, big)[:2] == ("completed", 1)
    assert status_of(url, after)[:2] == ("completed", 2)
    state, _, error = status_of(url, nested)
    assert state == "failed"
    assert "payload cannot be decoded: it is nested more deeply than" in str(error)
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_task_name_of_ten_thousand_characters_is_refused_everywhere(database_url, env):
    name = "t" * 10_000
    with pytest.raises(InvalidJob, match="task name must be a string of 1 to 255 characters"):
        Client(database_url).enqueue(name, {})
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_task_name_length"):
        query(database_url, "INSERT INTO worker.jobs (task) VALUES (%s)", (name,))
    proc = cli("enqueue", name, env=env)
    assert proc.returncode == 2
    assert "task name must be a string of 1 to 255 characters" in one_error_line(proc)
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


# -- rows PostgreSQL refuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "params", "error", "message"),
    [
        (
            "INSERT INTO worker.jobs (task) VALUES (convert_from('\\xff'::bytea, 'UTF8'))",
            None,
            psycopg.errors.CharacterNotInRepertoire,
            'invalid byte sequence for encoding "UTF8": 0xff',
        ),
        (
            "INSERT INTO worker.jobs (task) VALUES (E'nul\\x00here')",
            None,
            psycopg.errors.CharacterNotInRepertoire,
            'invalid byte sequence for encoding "UTF8": 0x00',
        ),
        (
            "INSERT INTO worker.jobs (task, payload) VALUES ('echo', '{\"k\": \"\\u0000\"}')",
            None,
            psycopg.errors.UntranslatableCharacter,
            "unsupported Unicode escape sequence",
        ),
        (
            # psycopg refuses before sending: text parameters cannot carry NUL.
            "INSERT INTO worker.jobs (task) VALUES (%s)",
            ("nul\x00here",),
            psycopg.DataError,
            "PostgreSQL text fields cannot contain NUL",
        ),
    ],
    ids=["invalid-utf8", "nul-in-text", "nul-in-jsonb", "nul-parameter"],
)
def test_invalid_utf8_and_nul_bytes_are_refused_by_postgresql(
    database_url, statement, params, error, message
):
    with pytest.raises(error, match=message):
        query(database_url, statement, params)
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


@pytest.mark.parametrize(
    ("columns", "values", "constraint"),
    [
        ("task, status", "'echo', 'running'", "jobs_status_valid"),
        ("task, status", "'echo', 'PENDING'", "jobs_status_valid"),
        ("task, priority", "'echo', 101", "jobs_priority_range"),
        ("task, priority", "'echo', -101", "jobs_priority_range"),
        ("task, retry_count", "'echo', -1", "jobs_retry_count_positive"),
        ("task, max_retries", "'echo', -1", "jobs_max_retries_positive"),
        ("task", "''", "jobs_task_name_length"),
        ("task, queue", "'echo', ''", "jobs_queue_name_length"),
        ("task, payload", "'echo', '[1, 2]'", "jobs_payload_is_object"),
    ],
)
def test_rows_out_of_range_are_refused_by_the_database(database_url, columns, values, constraint):
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        query(database_url, f"INSERT INTO worker.jobs ({columns}) VALUES ({values})")
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_priority_beyond_smallint_and_an_update_to_a_bad_status_are_refused(database_url):
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        query(database_url, "INSERT INTO worker.jobs (task, priority) VALUES ('echo', 70000)")
    job_id = insert(database_url, "echo")
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_status_valid"):
        query(database_url, "UPDATE worker.jobs SET status = 'done' WHERE id = %s", (job_id,))
    assert status_of(database_url, job_id)[0] == "pending"


# -- settings and the database at start -------------------------------------------------------


def settings_error(monkeypatch, tmp_path, capsys, values: dict[str, str]) -> str:
    """What `load_settings_or_exit` (used by every command) prints for `values`: exit code 2
    and one line, checked in-process to keep the many variants fast."""
    monkeypatch.chdir(tmp_path)  # no .env file
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as exit_:
            load_settings_or_exit()
    finally:
        get_settings.cache_clear()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://app:hunter2@db/app", "must look like postgresql://"),
        ("postgresql://app:hunter2@db:port/app", "has a port that is not a number"),
        ("postgresql://app:hunter2@db:5432", "must name a database"),
        ("not a url at all", "must look like postgresql://"),
        ("postgresql://app:hunter2%ZZ@db:5432/app", "a bad %-escape"),
        ("postgresql://app:hunter2@db:5432/app?colour=blue", "an unknown ?option"),
    ],
)
def test_malformed_database_url_is_refused_naming_the_variable(
    monkeypatch, tmp_path, capsys, url, message
):
    err = settings_error(monkeypatch, tmp_path, capsys, {"DATABASE_URL": url})
    assert "DATABASE_URL" in err and message in err and "hunter2" not in err


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({"WORKER_CONCURRENCY": "-1"}, "WORKER_CONCURRENCY"),
        ({"WORKER_CONCURRENCY": "0"}, "WORKER_CONCURRENCY"),
        ({"WORKER_POLL_MIN": "-0.5"}, "WORKER_POLL_MIN"),
        ({"WORKER_POLL_MIN": "5", "WORKER_POLL_MAX": "1"}, "WORKER_POLL_MIN"),
        ({"WORKER_LEASE_SECONDS": "soon"}, "WORKER_LEASE_SECONDS"),
        ({"WORKER_MAX_RETRIES": "-3"}, "WORKER_MAX_RETRIES"),
        ({"WORKER_TASK_TIMEOUT": "0"}, "WORKER_TASK_TIMEOUT"),
        ({"WORKER_MAX_PAYLOAD_BYTES": "-1"}, "WORKER_MAX_PAYLOAD_BYTES"),
        ({"WORKER_RETENTION_DAYS": "1e8"}, "WORKER_RETENTION_DAYS"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(
    monkeypatch, tmp_path, capsys, values, variable
):
    assert variable in settings_error(monkeypatch, tmp_path, capsys, values)


def test_worker_run_with_bad_settings_exits_2_with_one_line_and_no_secret(env):
    bad_url = cli("run", TASKS, env={**env, "DATABASE_URL": "mysql://app:hunter2@db/app"})
    assert bad_url.returncode == 2
    line = one_error_line(bad_url)
    assert "DATABASE_URL" in line and "hunter2" not in bad_url.stderr + bad_url.stdout
    negative = cli("run", TASKS, env={**env, "WORKER_CONCURRENCY": "-4"})
    assert negative.returncode == 2
    assert "WORKER_CONCURRENCY" in one_error_line(negative)


def test_unreachable_database_at_start_exits_after_the_connect_timeout(env):
    url = "postgresql://app:hunter2@127.0.0.1:9/app"  # port 9 (discard): nothing listens
    started = time.monotonic()
    proc = cli("run", TASKS, "--connect-timeout", "2", env={**env, "DATABASE_URL": url})
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    # One warning when it first fails (it retries meanwhile), then the error that ends it.
    assert "database unreachable" in lines[0] and "retrying up to 2 s" in lines[0], lines
    assert lines[-1].startswith("error: cannot reach the database after 2 s:"), lines
    assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout
    assert 2 <= took < 30


# -- results that are not JSON ----------------------------------------------------------------


def test_task_returning_a_value_that_cannot_be_stored_fails_with_a_clear_error(
    database_url, processes
):
    """Python's encoder accepts what PostgreSQL's jsonb refuses (NUL, half a surrogate pair);
    NaN and values nested thousands deep stop the encoder itself. Each such job fails naming
    the problem; the worker and the jobs after them carry on."""
    url = database_url
    expected = {
        "returns_nan": "returned a value that is not JSON-serialisable",
        "returns_nul": "it contains a NUL character",
        "returns_surrogate": "half of a UTF-16 surrogate pair",
        "returns_deep": "nested too deeply to be stored as JSON",
        "nan_stage": "stage not_a_number returned a value that is not JSON-serialisable",
    }
    bad = {task: insert(url, task) for task in expected}
    good = insert(url, "echo", '{"still": "works"}')
    proc = processes.worker(worker_env(url), TASKS)
    for job_id in [*bad.values(), good]:
        wait_until(lambda j=job_id: finished(url, j), 60, f"job {job_id}")
    for task, message in expected.items():
        state, _, error = status_of(url, bad[task])
        assert state == "failed" and message in str(error), (task, error)
        retries = "SELECT retry_count FROM worker.jobs WHERE id = %s"
        assert query(url, retries, (bad[task],)) == [(0,)], task  # no retry can help
    assert status_of(url, good)[:2] == ("completed", 1)
    assert proc.poll() is None and "Traceback" not in processes.log(proc)


def test_a_value_past_postgresqls_size_limit_fails_its_job_not_the_worker(database_url, processes):
    """A result (or progress message) over 256 MB is refused by PostgreSQL with an error of the
    class its outages raise. It must fail that job, or drop that event, once; retried like an
    outage it would hold up every outcome written with it, for ever."""
    url = database_url
    too_long = insert(url, "returns_too_long")
    reported = insert(url, "reports_too_long")
    proc = processes.worker(worker_env(url), TASKS)
    wait_until(lambda: finished(url, too_long) and finished(url, reported), 120, "both jobs")
    state, _, error = status_of(url, too_long)
    assert state == "failed", error
    assert str(error).startswith("the job's outcome could not be stored: Refused: string too long")
    assert status_of(url, reported)[:2] == ("completed", "reported")
    events = "SELECT message FROM worker.job_events WHERE job_id = %s ORDER BY id"
    wait_until(lambda: query(url, events, (reported,)) == [({"pct": 50},)], 30, "the small event")
    # A stage output that long fails its job too, with the stage marked failed saying why
    # (not left running, for the next attempt to take for a lost worker). One at a time: each
    # of these values costs the worker about 1 GB.
    stage_too_long = insert(url, "too_long_stage")
    wait_until(lambda: finished(url, stage_too_long), 120, "the pipeline")
    state, _, error = status_of(url, stage_too_long)
    assert state == "failed", error
    refused = "stage too_long returned a value that PostgreSQL refused to store (string too long"
    assert str(error).startswith(refused), error
    stages = "SELECT stage, status, error FROM worker.job_stages WHERE job_id = %s"
    [(stage, stage_status, stage_error)] = query(url, stages, (stage_too_long,))
    assert (stage, stage_status) == ("too_long", "failed") and stage_error == error
    # The same as the last stage of a pipeline with a cleanup, whose output is written with the
    # cleanup's start: the stage fails, then the cleanup runs, once.
    last_too_long = insert(url, "too_long_last")
    wait_until(lambda: finished(url, last_too_long), 120, "the pipeline with a cleanup")
    state, _, error = status_of(url, last_too_long)
    assert state == "failed", error
    assert str(error).startswith(refused.replace("too_long ", "too_long_at_last ")), error
    stages = "SELECT stage, status, attempt FROM worker.job_stages WHERE job_id = %s ORDER BY 1"
    assert query(url, stages, (last_too_long,)) == [
        ("cleans_up", "completed", 1),
        ("small_first", "completed", 1),
        ("too_long_at_last", "failed", 1),
    ]
    # The worker goes on, and never took the refusals for an outage.
    after = insert(url, "echo", '{"still": "works"}')
    wait_until(lambda: finished(url, after), 60, "the job after them")
    assert status_of(url, after)[:2] == ("completed", 1)
    log = processes.log(proc)
    assert "database unreachable" not in log and "Traceback" not in log, log
    assert f"progress event of job {reported} dropped: string too long" in log, log


def test_error_message_with_a_nul_byte_is_stored_readably(database_url, processes):
    url = database_url
    processes.worker(worker_env(url), TASKS)
    job_id = insert(url, "raises_nul")
    wait_until(lambda: finished(url, job_id), 60, "the job")
    state, _, error = status_of(url, job_id)
    assert state == "failed"
    assert "an error message with a NUL \\0 inside" in str(error)


HOSTILE_NAMES = ['a,"b}', "c\\d {x}", "NULL"]


@register(name='say "hi", {ok}\\', max_retries=0)
def hostile_named(payload: dict[str, object]) -> str:
    return "ran"


def test_queue_and_task_names_with_quotes_commas_braces_and_backslashes_are_claimed(
    database_url,
):
    """The claim passes its lists of queue and task names as array text: no name can split,
    merge or end an element."""
    client = Client(database_url)
    ids = [client.enqueue('say "hi", {ok}\\', {}, queue=q).id for q in HOSTILE_NAMES]
    ids.append(client.enqueue('say "hi", {ok}\\', {}, queue="a").id)  # not a queue it serves
    drain(url=database_url, queues=HOSTILE_NAMES)
    rows = dict(query(database_url, "SELECT id::text, status FROM worker.jobs", None))
    assert [rows[job_id] for job_id in ids] == ["completed"] * 3 + ["pending"]
