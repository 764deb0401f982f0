"""Why jobs failed, grouped: the `worker.job_failures` / `worker.failure_groups` views and
`worker failures`, on a real PostgreSQL. Failures whose first lines differ only in figures
(durations, ids, quoted values, hex) are one group; another error type or task is another."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
from support import insert_job, query

DEADLINE = (
    "stage wait failed: StageDeadlineExceeded: stage wait gave up: not done {} s after it first "
    "started (deadline {} s)\nTraceback (most recent call last):\n  ..."
)
DEADLINE_KEY = (
    "stage wait failed: StageDeadlineExceeded: stage wait gave up: not done <n> s after it "
    "first started (deadline <n> s)"
)


def failed(url: str, task: str, error: str, ago: str = "5 minutes") -> str:
    return insert_job(
        url,
        task=task,
        status="failed",
        error=error,
        finished_at=f"sql:now() - interval '{ago}'",
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "failures", *args],
        env={**env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def groups(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def test_failures_that_differ_only_in_figures_are_one_group_and_other_types_are_not(
    database_url,
):
    url = database_url
    failed(url, "export", DEADLINE.format(48.3, 30.0), ago="20 minutes")
    failed(url, "export", DEADLINE.format(61, 30.0), ago="10 minutes")
    latest = failed(url, "export", DEADLINE.format(1234.5, 45), ago="1 minute")
    failed(url, "export", "ValueError: order 'A-17' of 5f3a9c2e-0b1d-4e2f-8a3b-9c8d7e6f5a4b")
    failed(url, "export", 'ValueError: order "B-9" of 0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b')
    failed(url, "export", "KeyError: order 'A-17' of 5f3a9c2e-0b1d-4e2f-8a3b-9c8d7e6f5a4b")
    failed(url, "export", "RuntimeError: bad pointer 0x7f3a2c10 in step2, block 9f3ac2d1e0")
    failed(url, "export", "RuntimeError: bad pointer 0x10 in step2, block 00ab12cd34")
    failed(url, "import", DEADLINE.format(2.5, 1))  # another task: another group
    failed(url, "export", "the worker running this job was lost (no heartbeat for 15 s)")
    insert_job(url, task="export", status="completed", finished_at="sql:now()")  # no failure

    rows = query(
        url,
        "SELECT task, error_type, message, failures, example_job_id::text "
        "FROM worker.failure_groups",
    )
    assert rows[0] == ("export", "StageDeadlineExceeded", DEADLINE_KEY, 3, latest)
    assert sorted((r[:4] for r in rows[1:]), key=str) == [
        ("export", "KeyError", "KeyError: order <quoted> of <uuid>", 1),
        ("export", "RuntimeError", "RuntimeError: bad pointer <hex> in step2, block <hex>", 2),
        ("export", "ValueError", "ValueError: order <quoted> of <uuid>", 2),
        ("export", None, "the worker running this job was lost (no heartbeat for <n> s)", 1),
        ("import", "StageDeadlineExceeded", DEADLINE_KEY, 1),
    ]


def test_failure_groups_keeps_the_last_day_and_the_roles_may_read_it(database_url):
    failed(database_url, "export", "OSError: disk 3 full", ago="2 days")
    failed(database_url, "export", "OSError: disk 4 full", ago="2 hours")
    assert query(database_url, "SELECT failures FROM worker.failure_groups") == [(1,)]
    for role in ("worker_client", "worker_runner"):
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"SET ROLE {role}")
            assert conn.execute("SELECT count(*) FROM worker.job_failures").fetchall() == [(2,)]
            assert conn.execute("SELECT failures FROM worker.failure_groups").fetchall() == [(1,)]


def test_worker_failures_groups_the_window_it_is_given_most_frequent_first(env, database_url):
    url = database_url
    for figure in (1, 2, 3):
        failed(url, "send", f"TimeoutError: no answer after {figure} s", ago="10 minutes")
    failed(url, "send", "TimeoutError: no answer after 9 s", ago="3 hours")
    failed(url, "bill", "ValueError: amount -4.50 refused", ago="30 minutes")

    hour = groups(cli(env, "--since", "1h", "--json"))
    assert [(g["task"], g["error_type"], g["message"], g["failures"]) for g in hour] == [
        ("send", "TimeoutError", "TimeoutError: no answer after <n> s", 3),
        ("bill", "ValueError", "ValueError: amount -<n> refused", 1),
    ]
    assert [g["failures"] for g in groups(cli(env, "--since", "4h", "--json"))] == [4, 1]
    assert groups(cli(env, "--since", "5m", "--json")) == []
    only = groups(cli(env, "--since", "1d", "--task", "bill", "--json"))
    assert [g["task"] for g in only] == ["bill"]

    text = cli(env, "--since", "1h")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["count", "task", "error", "type"]
    assert lines[1].split()[:3] == ["3", "send", "TimeoutError"]
    assert "TimeoutError: no answer after <n> s" in lines[1]
    assert "no failures in the last 5m" in cli(env, "--since", "5m").stdout


def test_a_bad_since_is_a_usage_error_on_one_line(env):
    done = cli(env, "--since", "soon")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: Invalid value for --since: 'soon' is not an age like 30s, 15m, 12h, 7d or 2w "
        "(see `python -m worker failures --help`)"
    ]
