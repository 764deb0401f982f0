"""`worker demo` writes only where it is told to: with `DATABASE_URL` set and no
`--database-url`, it runs on the embedded server and writes nothing to that database; with
`--database-url`, it keeps its jobs on the `demo` queue, which its worker alone serves, and
leaves the `default` queue's jobs as they were."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, insert_job, query, worker_env
from support.servers import server_root

from worker.cli import app
from worker.db.embedded import LocalPostgres
from worker.schema import metadata

WORKER_TABLES = sorted(t.name for t in metadata.tables.values() if t.schema == "worker")


def _demo(env: dict[str, str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "demo", "--jobs", "3", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table of the worker schema, sorted."""
    return {t: sorted(query(url, f"SELECT * FROM worker.{t}"), key=repr) for t in WORKER_TABLES}


@pytest.mark.parametrize("where", ["environment", ".env"])
def test_with_database_url_set_the_demo_runs_embedded_and_writes_nothing_there(
    database_url: str, tmp_path: Path, where: str
) -> None:
    insert_job(database_url, task="add", payload='{"a": 1, "b": 2}')
    before = _rows(database_url)
    with server_root("demo-") as data:
        env = worker_env(database_url, WORKER_DATA_DIR=str(data))
        if where == ".env":  # as in a clone where .env.example was copied and filled in
            del env["DATABASE_URL"]
            (tmp_path / ".env").write_text(f"DATABASE_URL={database_url}\n")
        try:
            done = _demo(env, cwd=tmp_path)
        finally:
            LocalPostgres(data / "pg").stop(mode="immediate")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (data / "pg").is_dir(), "the embedded server's data folder"
    assert "DATABASE_URL is set and left alone" in done.stdout
    assert "on embedded PostgreSQL" in done.stdout
    assert "embedded PostgreSQL stopped" in done.stdout
    assert _rows(database_url) == before


def test_with_database_url_given_the_demo_keeps_to_its_own_queue(
    database_url: str, tmp_path: Path
) -> None:
    waiting = insert_job(database_url, task="add", payload='{"a": 1, "b": 2}')
    default_before = query(database_url, "SELECT * FROM worker.jobs WHERE queue = 'default'")
    env = worker_env(database_url, WORKER_DATA_DIR=str(tmp_path / "data"))
    del env["DATABASE_URL"]
    done = _demo(env, "--database-url", database_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert query(database_url, "SELECT * FROM worker.jobs WHERE queue = 'default'") == (
        default_before
    )
    assert query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", [waiting]) == [
        ("pending",)
    ]
    demo_jobs = query(
        database_url, "SELECT queue, status FROM worker.jobs WHERE id <> %s", [waiting]
    )
    assert len(demo_jobs) == 3 + 4, "three quick jobs and the four others"
    assert {queue for queue, _ in demo_jobs} == {"demo"}
    assert {status for _, status in demo_jobs} == {"completed", "failed"}
    assert not (tmp_path / "data").exists(), "no embedded server started"


@pytest.mark.parametrize(
    ("given", "code", "message"),
    [
        ("mysql://db/app", 2, "--database-url: must look like postgresql://"),
        (None, 1, "the worker schema is missing: run `worker migrate` first"),
    ],
)
def test_a_bad_or_unmigrated_database_url_is_one_line(
    given: str | None, code: int, message: str, empty_database_url: str
) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["demo", "--database-url", given or empty_database_url])
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert query(empty_database_url, "SELECT to_regclass('worker.jobs')") == [(None,)]
