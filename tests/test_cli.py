"""The `worker` program against a real PostgreSQL: every operator's verb, its --json output,
and its errors (one red line, exit code 1; usage errors exit code 2; never a traceback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer
from support import ROOT, Processes, insert_job, insert_worker, query, wait_for
from typer.main import get_command
from typer.testing import CliRunner

from worker import Client, cli
from worker.settings import get_settings

Invoke = Callable[..., Any]


@pytest.fixture
def worker_cli(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    """Runs `worker ARGS...` in this process against this test's database; checks the exit
    code and returns the result (`.stdout`, `.stderr`)."""
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setattr(cli.out, "width", 250)  # tables unsqueezed, so cells can be checked
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Any:
        result = runner.invoke(cli.app, list(args))
        assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
        assert "Traceback" not in result.stderr
        return result

    yield invoke
    get_settings.cache_clear()


def as_json(result: Any) -> Any:
    return json.loads(result.stdout)


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


# -- jobs --------------------------------------------------------------------------------------


def test_jobs_lists_newest_first_and_filters_by_status_queue_task_and_age(database_url, worker_cli):
    url = database_url
    old = insert_job(
        url,
        task="send",
        queue="emails",
        status="failed",
        error="boom\ntrace",
        created_at="sql:now() - interval '3 days'",
        finished_at="sql:now()",
    )
    mid = insert_job(url, task="send", queue="emails", created_at="sql:now() - interval '2 hours'")
    new = insert_job(
        url, task="resize", queue="images", created_at="sql:now() - interval '1 minute'"
    )

    assert ids(as_json(worker_cli("jobs", "--json"))) == [new, mid, old]
    assert ids(as_json(worker_cli("jobs", "--status", "failed", "--json"))) == [old]
    assert ids(as_json(worker_cli("jobs", "--queue", "emails", "--json"))) == [mid, old]
    assert ids(as_json(worker_cli("jobs", "--task", "resize", "--json"))) == [new]
    assert ids(as_json(worker_cli("jobs", "--older-than", "1h", "--json"))) == [mid, old]
    assert ids(as_json(worker_cli("jobs", "--newer-than", "1d", "--json"))) == [new, mid]
    assert ids(
        as_json(worker_cli("jobs", "--older-than", "1h", "--newer-than", "1d", "--json"))
    ) == [mid]
    assert as_json(worker_cli("jobs", "--task", "nothing", "--json")) == []

    (failed,) = as_json(worker_cli("jobs", "--status", "failed", "--json"))
    assert failed["error"] == "boom"  # the first line; `show` has the whole text
    assert failed["queue"] == "emails" and failed["retry_count"] == 0

    table = worker_cli("jobs").stdout
    assert table.index(new) < table.index(mid) < table.index(old)
    assert "page 1: 3 jobs" in table


def test_jobs_pages_do_not_overlap_and_say_when_more_follow(database_url, worker_cli):
    for i in range(5):
        insert_job(database_url, created_at=f"sql:now() - interval '{i} minutes'")
    everything = ids(as_json(worker_cli("jobs", "--json")))
    pages = [
        ids(as_json(worker_cli("jobs", "--limit", "2", "--page", str(p), "--json")))
        for p in (1, 2, 3, 4)
    ]
    assert pages == [everything[0:2], everything[2:4], everything[4:5], []]
    assert "more with --page 2" in worker_cli("jobs", "--limit", "2").stdout
    assert "more with" not in worker_cli("jobs", "--limit", "2", "--page", "3").stdout
    assert "no jobs match on page 4" in worker_cli("jobs", "--limit", "2", "--page", "4").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--older-than", "3x"), "'3x' is not an age"),
        (("--newer-than", "-5m"), "'-5m' is not an age"),
        (("--status", "running"), "'running' is not one of"),
        (("--limit", "0"), "--limit"),
        (("--page", "0"), "--page"),
        (("--page", "1000000000000000000"), "--page"),
    ],
)
def test_jobs_bad_filters_are_usage_errors(worker_cli, args, message):
    result = worker_cli("jobs", *args, code=2)
    assert message in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("run", "testtasks", "--concurrency", "100000"), 2, "--concurrency: "),
        (("run", "testtasks", "--queues", ","), 2, "--queues: "),
        (("prune", "--older-than", "1000000d"), 2, "out of range"),
        (("enqueue", "add", "--delay", "1e13"), 2, "from 0 to 100 years"),
        (("enqueue", "add", "--max-retries", "3000000000"), 2, "max_retries must be"),
        (("resume", "00000000-0000-0000-0000-000000000000", "--answer", "NaN"), 2, "answer"),
        (("enqueue", "add", "--unique-key", ""), 2, "unique_key must be a string"),
        (("queue", "limit", "q", "--concurrency", "0"), 2, "concurrency must be an integer"),
        (("queue", "limit", "q", "--burst", "2"), 2, "burst needs a rate"),
    ],
)
def test_values_out_of_range_are_usage_errors_of_one_line_that_write_nothing(
    database_url, worker_cli, args, code, message
):
    result = worker_cli(*args, code=code)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("enqueue", "add", "--payload", "{nope"), "--payload is not valid JSON: Expecting"),
        (("enqueue", "add", "--payload", "[1, 2]"), "payload"),
        (("resume", "0b0e", "--answer", "{nope"), "--answer is not valid JSON"),
        (("enqueue", "add", "--priority", "1000"), "priority must be an integer"),
        (("enqueue", "add", "--queue", ""), "queue name must be"),
        (("queue", "limit", "q", "--rate", "-1"), "rate must be a number"),
    ],
)
def test_a_bad_option_value_is_a_usage_error_exit_code_2(database_url, worker_cli, args, message):
    result = worker_cli(*args, code=2)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


# -- queues ------------------------------------------------------------------------------------


def test_queue_verbs_pause_limit_resume_and_list_queues(database_url, worker_cli):
    first = worker_cli("enqueue", "add", "--queue", "mail", "--unique-key", "k").stdout.strip()
    again = worker_cli("enqueue", "add", "--queue", "mail", "--unique-key", "k").stdout.strip()
    assert first == again  # the live job holding the key
    assert "paused" in worker_cli("queue", "pause", "mail").stdout
    limited = worker_cli("queue", "limit", "mail", "--concurrency", "2", "--rate", "5").stdout
    assert "2 at once; 5/s" in limited
    rows = as_json(worker_cli("queues", "--json"))
    assert [(r["name"], r["paused"], r["concurrency"], r["pending"]) for r in rows] == [
        ("mail", True, 2, 1)
    ]
    assert "mail" in worker_cli("queues").stdout
    assert "running" in worker_cli("queue", "resume", "mail").stdout
    assert "limits: none" in worker_cli("queue", "limit", "mail").stdout


# -- show --------------------------------------------------------------------------------------


def test_show_gives_payload_stages_outputs_retries_and_events(
    env, database_url, processes: Processes, worker_cli
):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("counted", {"fail_second_until": 1})
    job.wait_sync(timeout=30)
    plain = client.enqueue("counts_up", {"n": 3, "tick": 0.01})
    plain.wait_sync(timeout=30)
    # Events are written apart from the job's status, every 50 ms (slower on a loaded disk).
    stored = "SELECT count(*) FROM worker.job_events WHERE job_id = %s AND status = 'progress'"
    wait_for(lambda: query(database_url, stored, (plain.id,)) == [(3,)], message="the events")

    data = as_json(worker_cli("show", job.id, "--json"))
    assert data["status"] == "completed" and data["retry_count"] == 1
    assert data["payload"] == {"fail_second_until": 1}
    stages = {s["stage"]: s for s in data["stages"]}
    assert stages["third"]["output"] == {"n": 3} and stages["third"]["status"] == "completed"
    assert stages["second"]["attempt"] == 2
    assert stages["tidy"]["kind"] == "cleanup" and stages["tidy"]["output"] == "tidied"

    events = as_json(worker_cli("show", plain.id, "--json"))["events"]
    progress = [e["message"] for e in events if e["status"] == "progress"]
    assert [m["i"] for m in progress] == [1, 2, 3]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)

    text = worker_cli("show", job.id).stdout
    for expected in (
        "counted",
        "completed",
        "1 of 3",
        '{"fail_second_until": 1}',
        "stages",
        "third",
        '{"n": 3}',
        "tidied",
    ):
        assert expected in text
    assert "events" in worker_cli("show", plain.id).stdout
    limited = as_json(worker_cli("show", plain.id, "--json", "--events", "2"))["events"]
    assert [e["id"] for e in limited] == [e["id"] for e in events][-2:]


def test_show_of_a_failed_job_gives_its_retry_count_and_last_error(
    env, database_url, processes, worker_cli
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("always_fails", {"key": "k"}, max_retries=2)
    wait_for(lambda: job.refresh().status == "failed", timeout=30, message="job failed")
    data = as_json(worker_cli("show", job.id, "--json"))
    assert data["retry_count"] == 2 and data["max_retries"] == 2
    assert data["error"].startswith("RuntimeError: this task always fails")
    text = worker_cli("show", job.id).stdout
    assert "2 of 2" in text and "last error" in text and "this task always fails" in text


def test_show_errors(worker_cli):
    missing = str(uuid.uuid4())
    assert worker_cli("show", missing, code=1).stderr.strip() == f"error: no job {missing}"
    assert "'nope' is not a job id" in worker_cli("show", "nope", code=2).stderr


def test_every_id_form_worker_jobs_prints_names_its_job_in_every_command(
    database_url, worker_cli, monkeypatch
):
    url = database_url
    failed = insert_job(
        url,
        id="0aaa1111-2222-4333-8444-55556666beef",
        status="failed",
        error="boom",
        finished_at="sql:now()",
    )
    paused = insert_job(url, id="0bbb1111-2222-4333-8444-55556666cafe", status="paused")
    waiting = insert_job(
        url, id="0ccc1111-2222-4333-8444-55556666d00d", run_at="sql:now() + interval '1 hour'"
    )
    monkeypatch.setattr(cli.out, "width", 60)  # a narrow terminal: the ids are shortened
    printed = {
        job_id: row["id"]
        for row in table_rows(worker_cli("jobs").stdout, "id")
        for job_id in (failed, paused, waiting)
        if job_id.endswith(row["id"].removeprefix("…"))
    }
    assert len(printed) == 3 and all(shown.startswith("…") for shown in printed.values())

    for job_id, shown in printed.items():
        assert as_json(worker_cli("show", shown, "--json"))["job_id"] == job_id
    assert as_json(worker_cli("show", "0aaa", "--json"))["job_id"] == failed
    assert as_json(worker_cli("show", "...55556666beef", "--json"))["job_id"] == failed
    assert as_json(worker_cli("show", "6666beef", "--json"))["job_id"] == failed  # no id begins so
    assert f"job {failed} is pending again" in worker_cli("retry", "…6666beef").stdout
    assert f"job {paused} resumed" in worker_cli("resume", "0bbb1111-22").stdout
    assert f"job {waiting} cancelled" in worker_cli("cancel", "…d00d").stdout
    assert query(url, "SELECT status FROM worker.jobs ORDER BY id") == [
        ("pending",),
        ("pending",),
        ("cancelled",),
    ]


def test_a_part_of_a_job_id_naming_several_jobs_or_none_is_one_line(database_url, worker_cli):
    url = database_url
    first = insert_job(url, id="0ddd1111-2222-4333-8444-555566660001")
    second = insert_job(url, id="0ddd2222-2222-4333-8444-555566660001")
    for command in ("show", "cancel", "retry", "resume"):
        result = worker_cli(command, "0ddd", code=2)
        assert result.stderr.strip() == (
            f"error: job id '0ddd' is ambiguous: 2 job ids begin with it ({first}, {second}); "
            "give more characters"
        )
        result = worker_cli(command, "…66660001", code=2)
        assert f"2 job ids end with it ({first}, {second})" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        result = worker_cli(command, "beef", code=1)
        assert result.stderr.strip() == "error: no job id begins or ends with 'beef'"
        result = worker_cli(command, "…0ddd", code=1)
        assert result.stderr.strip() == "error: no job id ends with '0ddd'"
    assert query(url, "SELECT count(*) FROM worker.jobs WHERE status = 'pending'") == [(2,)]


def test_cancelling_an_ended_job_says_it_had_ended_with_its_status(database_url, worker_cli):
    url = database_url
    for status in ("completed", "failed", "cancelled"):
        ended = insert_job(url, status=status, finished_at="sql:now() - interval '1 hour'")
        result = worker_cli("cancel", ended, code=1)
        assert result.stderr.strip() == f"error: job {ended} is already {status}: nothing to cancel"
        assert result.stdout == ""
        assert query(
            url,
            "SELECT status, cancel_requested, finished_at < now() - interval '1 minute' "
            "FROM worker.jobs WHERE id = %s",
            (ended,),
        ) == [(status, False, True)]
    missing = str(uuid.uuid4())
    assert worker_cli("cancel", missing, code=1).stderr.strip() == f"error: no job {missing}"


# -- retry -------------------------------------------------------------------------------------


def test_retry_puts_a_failed_job_back_and_refuses_a_completed_one(database_url, worker_cli):
    failed = insert_job(
        database_url, status="failed", retry_count=3, error="boom", finished_at="sql:now()"
    )
    done = insert_job(database_url, status="completed", finished_at="sql:now()")
    assert f"job {failed} is pending again" in worker_cli("retry", failed).stdout
    assert query(
        database_url, "SELECT status, retry_count, error FROM worker.jobs WHERE id = %s", (failed,)
    ) == [("pending", 0, None)]
    result = worker_cli("retry", done, code=1)
    assert "only failed or cancelled jobs can be retried" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bulk_retry_moves_exactly_the_matching_jobs_in_batches(database_url, worker_cli):
    url = database_url
    query(
        url,
        """
        INSERT INTO worker.jobs (task, queue, status, retry_count, error, finished_at)
        SELECT 'send', CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, 'failed', 3, 'boom', now()
        FROM generate_series(1, 2500) AS i""",
    )
    other_task = insert_job(url, task="resize", status="failed", finished_at="sql:now()")
    cancelled = insert_job(url, task="send", status="cancelled", finished_at="sql:now()")
    completed = insert_job(url, task="send", status="completed", finished_at="sql:now()")

    result = worker_cli("retry", "--all", "--task", "send", "--status", "failed")
    assert "2500 jobs back to pending (a: 1250, b: 1250)" in result.stdout
    assert "retrying failed jobs" in result.stderr  # the progress bar, on stderr
    assert query(
        url,
        "SELECT status, retry_count, error IS NULL, count(*) FROM worker.jobs "
        "WHERE task = 'send' GROUP BY 1, 2, 3 ORDER BY 1",
    ) == [("cancelled", 0, True, 1), ("completed", 0, True, 1), ("pending", 0, True, 2500)]
    assert query(
        url,
        "SELECT status FROM worker.jobs WHERE id IN (%s, %s) ORDER BY status",
        (other_task, cancelled),
    ) == [("cancelled",), ("failed",)]
    assert completed

    result = worker_cli("retry", "--all", "--status", "cancelled", "--queue", "default")
    assert "1 jobs back to pending (default: 1)" in result.stdout
    assert "no failed jobs match" in worker_cli("retry", "--all", "--task", "send").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a job id, or --all"),
        ((str(uuid.UUID(int=1)), "--all"), "not both"),
        ((str(uuid.UUID(int=1)), "--task", "send"), "not both"),
        (("--all", "--status", "completed"), "'completed' is not one of"),
    ],
)
def test_retry_usage_errors(worker_cli, args, message):
    assert message in worker_cli("retry", *args, code=2).stderr


# -- stats -------------------------------------------------------------------------------------


def test_stats_reports_each_queue(database_url, worker_cli):
    url = database_url
    for _ in range(2):
        insert_job(url, queue="emails", run_at="sql:now() - interval '2 minutes'")
    insert_job(url, queue="emails", run_at="sql:now() + interval '1 hour'")
    insert_job(url, queue="emails", status="processing", started_at="sql:now()")
    insert_job(url, queue="emails", status="paused")
    for _ in range(2):
        insert_job(url, queue="emails", status="failed", finished_at="sql:now()")
    insert_job(url, queue="emails", status="failed", finished_at="sql:now() - interval '2 hours'")
    for _ in range(3):
        insert_job(url, queue="reports", status="completed", finished_at="sql:now()")
    insert_job(
        url, queue="reports", status="completed", finished_at="sql:now() - interval '10 minutes'"
    )

    emails, reports = as_json(worker_cli("stats", "--json"))
    oldest = emails.pop("oldest_pending_seconds")
    assert 100 < oldest < 600
    assert emails == {
        "queue": "emails",
        "pending": 3,
        "scheduled": 1,
        "processing": 1,
        "paused": 1,
        "failed_last_hour": 2,
        "completed_last_minute": 0,
    }
    assert reports == {
        "queue": "reports",
        "pending": 0,
        "scheduled": 0,
        "processing": 0,
        "paused": 0,
        "failed_last_hour": 0,
        "oldest_pending_seconds": 0.0,
        "completed_last_minute": 3,
    }
    table = worker_cli("stats").stdout
    assert "emails" in table and "reports" in table and "2m" in table
    # No worker runs: the pending jobs wait, by task.
    assert "waiting: 3 of task 'add' in queue 'emails': no live worker runs the queue" in table


def test_stats_on_an_idle_database_says_so(worker_cli):
    assert as_json(worker_cli("stats", "--json")) == []
    assert "no jobs pending" in worker_cli("stats").stdout


# -- workers -----------------------------------------------------------------------------------


def test_workers_lists_live_workers_with_their_jobs_and_flags_late_ones(
    env, database_url, processes, worker_cli
):
    proc = processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("effect", {"key": "slow", "sleep": 30})
    wait_for(lambda: job.refresh().status == "processing", timeout=30, message="processing")
    late = str(uuid.uuid4())
    insert_worker(
        database_url, "1 hour", hostname="gone-host", pid=4242, concurrency=5, worker_id=late
    )

    listed = {w["id"]: w for w in as_json(worker_cli("workers", "--json"))}
    assert len(listed) == 2
    (live,) = [w for w in listed.values() if w["id"] != late]
    assert live["pid"] == proc.pid and live["alive"] is True
    assert live["jobs"] == [job.id] and live["queues"] == ["default"]
    assert live["heartbeat_age_seconds"] < 15
    assert listed[late]["alive"] is False and listed[late]["jobs"] == []

    table = worker_cli("workers").stdout
    assert "alive" in table and "late" in table and "gone-host" in table and "1/10" in table


def test_workers_when_none_run(worker_cli):
    assert as_json(worker_cli("workers", "--json")) == []
    assert "no workers registered" in worker_cli("workers").stdout


# -- prune -------------------------------------------------------------------------------------


def test_prune_deletes_old_finished_jobs_only_with_a_progress_bar(database_url, worker_cli):
    url = database_url
    query(
        url,
        """
        INSERT INTO worker.jobs (task, status, finished_at)
        SELECT 'add', (ARRAY['completed', 'failed', 'cancelled'])[1 + i % 3],
               now() - interval '10 days'
        FROM generate_series(1, 2500) AS i""",
    )
    recent = insert_job(url, status="completed", finished_at="sql:now() - interval '1 day'")
    waiting = insert_job(url, created_at="sql:now() - interval '30 days'")

    result = worker_cli("prune", "--older-than", "7d")
    assert "removed 2500 finished jobs" in result.stdout
    assert "pruning finished jobs" in result.stderr
    remaining = {r[0] for r in query(url, "SELECT id::text FROM worker.jobs")}
    assert remaining == {recent, waiting}
    assert "removed 0 finished jobs" in worker_cli("prune").stdout
    assert "not an age" in worker_cli("prune", "--older-than", "soon", code=2).stderr


def test_prune_dry_run_counts_by_status_and_deletes_nothing(database_url, worker_cli):
    url = database_url
    for status in ("completed", "completed", "failed"):
        insert_job(url, status=status, finished_at="sql:now() - interval '10 days'")
    insert_job(url, status="cancelled", finished_at="sql:now()")
    result = worker_cli("prune", "--older-than", "7d", "--dry-run")
    assert result.stdout.strip() == (
        "would remove 3 finished jobs (completed: 2, failed: 1); nothing removed (--dry-run)"
    )
    assert query(url, "SELECT count(*) FROM worker.jobs") == [(4,)]
    # Not a terminal (a script, cron): it deletes without asking, as it always did.
    assert "removed 3 finished jobs" in worker_cli("prune", "--older-than", "7d").stdout
    assert query(url, "SELECT status FROM worker.jobs") == [("cancelled",)]


def _prune_on_a_terminal(env: dict[str, str], answer: str, *args: str) -> tuple[int, str]:
    """`worker prune ARGS` with a terminal as its stdin, answering its question; its exit code
    and everything it printed."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "prune", *args],
        env=env,
        cwd=ROOT,
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    os.close(follower)
    os.write(leader, answer.encode())
    printed, _ = proc.communicate(timeout=120)
    os.close(leader)
    return proc.returncode, printed


def test_prune_on_a_terminal_asks_first_unless_yes(database_url, env):
    url = database_url
    for _ in range(2):
        insert_job(url, status="failed", finished_at="sql:now() - interval '10 days'")
    code, printed = _prune_on_a_terminal(env, "n\n", "--older-than", "7d")
    assert "remove 2 finished jobs (failed: 2) older than 7d? [y/N]" in printed
    assert code == 1 and "nothing removed" in printed
    assert query(url, "SELECT count(*) FROM worker.jobs") == [(2,)]
    code, printed = _prune_on_a_terminal(env, "y\n", "--older-than", "7d")
    assert code == 0 and "removed 2 finished jobs" in printed
    insert_job(url, status="failed", finished_at="sql:now() - interval '10 days'")
    code, printed = _prune_on_a_terminal(env, "", "--older-than", "7d", "--yes")
    assert code == 0 and "?" not in printed and "removed 1 finished jobs" in printed
    assert query(url, "SELECT count(*) FROM worker.jobs") == [(0,)]


# -- the other verbs ---------------------------------------------------------------------------


def test_enqueue_cancel_resume_round_trip(env, database_url, processes, worker_cli):
    job_id = worker_cli(
        "enqueue", "add", "--payload", '{"a": 2, "b": 3}', "--queue", "later", "--delay", "3600"
    ).stdout.strip()
    assert query(
        database_url,
        "SELECT task, queue, payload, status FROM worker.jobs WHERE id = %s",
        (job_id,),
    ) == [("add", "later", {"a": 2, "b": 3}, "pending")]
    assert f"job {job_id} cancelled" in worker_cli("cancel", job_id).stdout
    assert query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", (job_id,)) == [
        ("cancelled",)
    ]

    processes.worker(env, "testtasks")
    asked = Client(database_url).enqueue("ask", {"question": "ship it?"})
    wait_for(lambda: asked.refresh().status == "paused", timeout=30, message="paused")
    assert "resumed" in worker_cli("resume", asked.id, "--answer", '{"ok": true}').stdout
    assert asked.wait_sync(timeout=30) == {"answer": {"ok": True}}
    assert "not paused" in worker_cli("resume", asked.id, code=1).stderr
    assert "not valid JSON" in worker_cli("resume", asked.id, "--answer", "{no", code=2).stderr
    result = worker_cli(
        "enqueue", "add", "--payload", '{"a": 1, "b": 1}', "--wait", "--timeout", "30"
    )
    assert result.stdout.strip().splitlines()[-1] == "2"


def test_migrate_creates_the_schema_and_prints_sql(empty_database_url, monkeypatch, worker_cli):
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    get_settings.cache_clear()
    lines = worker_cli("migrate").stdout.strip().splitlines()
    assert all(len(line.split(": ", 1)[1]) > 3 for line in lines[:-1])  # each with its title
    assert [line.split(":")[0] for line in lines[:-1]] == [
        f"applied {n:04d}" for n in range(1, len(lines))
    ]
    head = lines[-2].split()[1].rstrip(":")
    assert lines[-1] == f"schema is up to date at {head}"
    assert worker_cli("migrate").stdout.strip() == f"already up to date at {head}"
    assert query(empty_database_url, "SELECT to_regclass('worker.queue_stats')::text") == [
        ("worker.queue_stats",)
    ]
    sql_text = worker_cli("migrate", "--sql").stdout
    assert "CREATE VIEW worker.queue_stats" in sql_text and "CREATE TABLE worker.jobs" in sql_text


def test_every_command_has_an_example_in_its_help():
    group = get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)
    commands: list[tuple[str, Any]] = []
    for name, command in group.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            commands += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            commands.append((name, command))
    assert {"jobs", "show", "retry", "stats", "workers", "prune", "db start"} <= dict(
        commands
    ).keys()

    def example(help_text: str | None) -> str:
        lines = [line.strip() for line in (help_text or "").splitlines()]
        return next((line for line in lines if line.startswith("Example:")), "")

    missing = [name for name, command in commands if f"worker {name}" not in example(command.help)]
    assert missing == []


# -- errors through the real entry point -------------------------------------------------------


def test_errors_are_one_red_line_with_the_right_exit_code(empty_database_url, env):
    closed = "postgresql://app:s3cret@127.0.0.1:9/app"
    cases = [
        ({"DATABASE_URL": closed}, ["stats"], 1, "cannot reach the database"),
        ({"DATABASE_URL": empty_database_url}, ["jobs"], 1, "run `worker migrate` first"),
        ({}, ["jobs", "--limit", "0"], 2, "Invalid value for '--limit'"),
        ({}, ["show", "nope"], 2, "'nope' is not a job id"),
        ({}, ["nosuch"], 2, "No such command 'nosuch'"),
        ({"WORKER_LEASE_SECONDS": "-1"}, ["workers"], 2, "WORKER_LEASE_SECONDS"),
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "worker", *args],
            env={**env, **extra},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra, args, _, _ in cases
    ]
    for proc, (_, args, code, message) in zip(procs, cases, strict=True):
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == code, (args, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("error: "), (args, stderr)
        assert message in stderr, (args, stderr)
        assert "s3cret" not in stderr and stdout == ""


BROKEN_MODULES = {
    "bad_syntax": ("x = 1\ndef f(:\n    pass\n", ":2: SyntaxError: invalid syntax"),
    "raises_at_import": (
        "import os\n\nraise RuntimeError('no API key\\nsecond line')\n",
        ":3: RuntimeError: no API key",
    ),
    "imports_a_missing_module": (
        "import no_such_dependency_zz\n",
        ":1: ModuleNotFoundError: No module named 'no_such_dependency_zz'",
    ),
}


@pytest.mark.parametrize("command", ["run", "schedule"])
def test_a_task_module_that_fails_to_import_is_one_line_with_its_file_and_line(
    env, tmp_path, command
):
    for name, (source, _) in BROKEN_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "worker", command, name],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in [*BROKEN_MODULES, "no_such_module_zz"]
    }
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, (name, stderr)
        assert stderr.count("\n") == 1 and "Traceback" not in stderr, (name, stderr)
        assert stderr.startswith(f"error: cannot import task module {name!r}: "), stderr
        if name in BROKEN_MODULES:
            where = str(tmp_path / f"{name}.py") + BROKEN_MODULES[name][1]
            assert where in stderr, (name, stderr)
        else:
            assert "No module named 'no_such_module_zz'" in stderr


# -- tables on a standard terminal --------------------------------------------------------------

LONG_TASK = "reports.monthly.generate_invoice_batch_for_region"


def at_80_columns(env: dict[str, str], *commands: str) -> dict[str, str]:
    """Each `worker <command>`'s stdout on an 80-column terminal, the processes run at once."""
    procs = {
        command: subprocess.Popen(
            [sys.executable, "-m", "worker", command],
            env={**env, "COLUMNS": "80"},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    }
    outputs = {}
    for command, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, (command, stderr)
        outputs[command] = stdout
    return outputs


def table_rows(text: str, key: str) -> list[dict[str, str]]:
    """The rows of a table as printed: each column read under its header, a wrapped cell's
    lines joined (a line whose `key` column is empty continues the row above)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0]
    found = list(re.finditer(r"\S+", header))
    names = [m.group() for m in found]
    starts = [m.start() for m in found]
    rows: list[dict[str, str]] = []
    for line in lines[1:]:
        if not line.startswith(" ") and line.split()[0] in ("page", "ids"):
            break  # the footer
        cells = {
            name: line[start : starts[i + 1] if i + 1 < len(names) else None].strip()
            for i, (name, start) in enumerate(zip(names, starts, strict=True))
        }
        if cells[key]:
            rows.append(cells)
        else:
            for name, cell in cells.items():
                rows[-1][name] += cell
    return rows


def test_tables_fit_80_columns_shortening_ids_never_the_task_or_the_status(database_url, env):
    url = database_url
    statuses = ["pending", "processing", "completed", "failed", "cancelled", "paused"]
    made = {
        insert_job(
            url, task=LONG_TASK, queue="billing-eu-west", status=status, error="E: x" * 30
        ): status
        for status in statuses
    }
    made[insert_job(url, task="resize", queue="images")] = "pending"
    host = "ip-10-0-12-34.eu-west-1.compute.internal"
    insert_worker(url, hostname=host, pid=4242, concurrency=8)
    Client(url).pause_queue("billing-eu-west")

    printed = at_80_columns(env, "jobs", "queues", "stats", "workers")

    for command, text in printed.items():
        widest = max(len(line.rstrip()) for line in text.splitlines())
        assert widest <= 80, (command, text)
    jobs = table_rows(printed["jobs"], "id")
    assert len(jobs) == len(made)
    for row in jobs:
        (job_id,) = [i for i in made if i.endswith(row["id"].removeprefix("…"))]
        assert row["id"].startswith("…") and len(row["id"]) >= 9
        assert row["status"] == made[job_id]
        assert row["task"] == (LONG_TASK if row["task"] != "resize" else "resize")
    assert sorted(row["task"] for row in jobs).count(LONG_TASK) == len(statuses)
    assert "--json shows them whole" in printed["jobs"]

    queues = {row["queue"]: row for row in table_rows(printed["queues"], "queue")}
    assert queues["billing-eu-west"]["state"] == "paused"
    assert queues["billing-eu-west"]["pending"] == "1"
    stats = {row["queue"]: row for row in table_rows(printed["stats"], "queue")}
    assert stats["billing-eu-west"]["processing"] == "1" and stats["images"]["pending"] == "1"
    assert "…" not in printed["stats"].splitlines()[0]  # every header whole
    (worker_row,) = table_rows(printed["workers"], "id")
    assert worker_row["pid"] == "4242" and worker_row["jobs"] == "0/8"
    assert worker_row["state"] in ("alive", "late")  # whole, whichever the lease says
    assert host.startswith(worker_row["host"].removesuffix("…"))
