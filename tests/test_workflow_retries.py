"""Retrying a failed job of a workflow re-arms the descendants its failure cancelled, and only
those, whoever retries it (the client, `worker retry --all`, the console's bulk retry): real
`worker run` processes against a real PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Callable

import psycopg
import pytest
from starlette.testclient import TestClient
from support import Processes, query, wait_for
from typer.testing import CliRunner
from workflowtasks import GATE

from worker import Client, Workflow, cli
from worker.api import create_app
from worker.settings import get_settings

TOKEN = "rearm-token-3f9"


def _status(url: str, job_id: str) -> tuple[str, str | None]:
    (row,) = query(url, "SELECT status, error FROM worker.jobs WHERE id = %s", (job_id,))
    return row[0], row[1]


def _runs(url: str, job_id: str) -> list[str]:
    rows = query(url, "SELECT kind FROM effects WHERE job = %s ORDER BY at", (job_id,))
    return [str(r[0]) for r in rows if r[0] != "fix"]


def _fix(url: str, job_id: str) -> None:
    query(url, "INSERT INTO effects (job, kind) VALUES (%s, 'fix')", (job_id,))


def _wait_status(url: str, job_id: str, status: str) -> None:
    wait_for(lambda: _status(url, job_id)[0] == status, message=f"{job_id} {status}")


def _by_client(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for (job_id,) in query(url, "SELECT id FROM worker.jobs WHERE status = 'failed'"):
        Client(url).retry(str(job_id))


def _by_cli(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli.app, ["retry", "--all", "--task", "flaky"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)


def _by_console(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"verb": "retry", "filter": {"tab": "failed"}, "expected": 1}
    with TestClient(create_app(url, TOKEN), base_url="http://127.0.0.1") as http:
        answer = http.post("/console/bulk", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and answer.json()["changed"] == 1, answer.text


RETRIES: dict[str, Callable[[str, pytest.MonkeyPatch], None]] = {
    "client": _by_client,
    "cli": _by_cli,
    "console": _by_console,
}


@pytest.mark.parametrize("how", sorted(RETRIES))
def test_a_retried_parent_re_arms_the_descendants_its_failure_cancelled(
    env, database_url, processes: Processes, monkeypatch, how
):
    client = Client(database_url)
    wf = Workflow("rearm")
    parent = wf.add("flaky", {"n": 1}, name="parent", max_retries=0)
    sibling = wf.add("part", {"n": 2}, name="sibling")
    child = wf.add("fan_in", {}, name="child", after=[parent, sibling])
    wf.add("fan_in", {}, name="grandchild", after=[child])
    wf.add("fan_in", {}, name="by_hand", after=[parent])
    wf.add("finalize", {}, name="clean_up", after=["grandchild"], on_parent_failure="run")
    handle = wf.enqueue(client=client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    client.cancel(ids["by_hand"])
    processes.worker(env, "workflowtasks")
    _wait_status(database_url, ids["clean_up"], "completed")
    assert _status(database_url, ids["grandchild"]) == (
        "cancelled",
        f"cancelled: parent {ids['child']} (child) was cancelled",
    )

    _fix(database_url, ids["parent"])
    RETRIES[how](database_url, monkeypatch)
    _wait_status(database_url, ids["grandchild"], "completed")
    for name in ("parent", "child", "grandchild"):
        assert _status(database_url, ids[name]) == ("completed", None)
    assert _runs(database_url, ids["child"]) == ["ran:0"]
    assert _runs(database_url, ids["grandchild"]) == ["ran:0"]
    # Cancelled by hand, not by the parent's failure: it stays cancelled.
    assert _status(database_url, ids["by_hand"])[0] == "cancelled"
    assert _runs(database_url, ids["by_hand"]) == []
    # The finalizer ran when its parent was cancelled; it does not run a second time.
    assert _runs(database_url, ids["clean_up"]) == ["finalized"]
    assert query(database_url, "SELECT count(*) FROM worker.held_jobs")[0][0] == 0


def test_a_child_another_failed_parent_still_cancels_stays_cancelled_naming_it(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    wf = Workflow("two failures")
    first = wf.add("flaky", {"n": 1}, name="first", max_retries=0)
    second = wf.add("flaky", {"n": 2}, name="second", max_retries=0)
    wf.add("fan_in", {}, name="child", after=[first, second])
    handle = wf.enqueue(client=client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    processes.worker(env, "workflowtasks")
    _wait_status(database_url, ids["second"], "failed")
    _wait_status(database_url, ids["first"], "failed")
    # The parent whose failure was committed first cancelled the child (the lower id, when
    # both were written together); the other is retried last.
    named = {f"cancelled: parent {ids[n]} ({n}) was failed": n for n in ("first", "second")}
    status, error = _status(database_url, ids["child"])
    assert status == "cancelled" and error in named
    retried_first = named[error]
    other = "second" if retried_first == "first" else "first"

    _fix(database_url, ids[retried_first])
    client.retry(ids[retried_first])
    # Decided in the retry's own transaction: the other failure still cancels the child.
    assert _status(database_url, ids["child"]) == (
        "cancelled",
        f"cancelled: parent {ids[other]} ({other}) was failed",
    )
    _wait_status(database_url, ids[retried_first], "completed")
    assert _status(database_url, ids["child"])[0] == "cancelled"

    _fix(database_url, ids[other])
    client.retry(ids[other])
    _wait_status(database_url, ids["child"], "completed")
    assert _runs(database_url, ids["child"]) == ["ran:0"]


def test_a_held_finalizer_waits_again_for_a_retried_parent(database_url):
    client = Client(database_url)
    wf = Workflow("finalizer")
    failed = wf.add("flaky", {}, name="failed", max_retries=0)
    later = wf.add("part", {"n": 1}, name="later", delay=3600)
    wf.add("finalize", {}, name="clean_up", after=[failed, later], on_parent_failure="run")
    handle = wf.enqueue(client=client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    query(database_url, "UPDATE worker.jobs SET status = 'failed' WHERE id = %s", (ids["failed"],))
    waiting = "SELECT waiting_on, status FROM worker.jobs WHERE id = %s"
    assert query(database_url, waiting, (ids["clean_up"],)) == [(1, "held")]
    # A retry in plain SQL: the database re-arms, whoever moves the job.
    query(database_url, "UPDATE worker.jobs SET status = 'pending' WHERE id = %s", (ids["failed"],))
    assert query(database_url, waiting, (ids["clean_up"],)) == [(2, "held")]


def test_a_retry_racing_another_parent_s_outcome_leaves_no_child_held(
    env, database_url, processes: Processes
):
    """Each child waits for a failed parent, retried, and a running one, let go at the same
    moment: whichever commits first, the child counts the other and runs once."""
    client = Client(database_url)
    processes.worker(env, "workflowtasks", extra={"WORKER_CONCURRENCY": "30"})
    rounds: list[dict[str, str]] = []
    with psycopg.connect(database_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        for _ in range(20):
            wf = Workflow("raced retry")
            failed = wf.add("flaky", {"n": 1}, name="failed", max_retries=0)
            running = wf.add("part", {"n": 2, "gate": True}, name="running")
            wf.add("fan_in", {}, name="child", after=[failed, running])
            handle = wf.enqueue(client=client)
            rounds.append({name: job.job_id for name, job in handle.jobs.items()})
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND NOT granted"
        )
        wait_for(lambda: query(database_url, waiting, (GATE,))[0][0] == 20, message="at the gate")
        for ids in rounds:
            _wait_status(database_url, ids["child"], "cancelled")
            _fix(database_url, ids["failed"])
        lock.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        for ids in rounds:  # while the running parents' outcomes are being written
            client.retry(ids["failed"])
    for ids in rounds:
        _wait_status(database_url, ids["child"], "completed")
        assert _runs(database_url, ids["child"]) == ["ran:0"]
    assert query(database_url, "SELECT count(*) FROM worker.held_jobs")[0][0] == 0


def test_a_child_cancelled_as_not_needed_is_not_re_armed(database_url):
    """A `run_if_failed` child whose parents all completed is cancelled as not needed, and so
    are the jobs after it, in the same settling; a parent moved back by hand in SQL re-arms
    none of them, as that decision is not a parent's ending cancelling it."""
    client = Client(database_url)
    wf = Workflow("not needed")
    done = wf.add("part", {"n": 1}, name="done")
    alert = wf.add("finalize", {}, name="alert", after=[done], on_parent_failure="run_if_failed")
    wf.add("finalize", {}, name="after_alert", after=[alert])
    ids = {name: job.job_id for name, job in wf.enqueue(client=client).jobs.items()}
    moved = "UPDATE worker.jobs SET status = %s WHERE id = %s"
    query(database_url, moved, ("completed", ids["done"]))
    assert _status(database_url, ids["alert"]) == (
        "cancelled",
        "cancelled: not needed, every parent completed",
    )
    assert _status(database_url, ids["after_alert"]) == (
        "cancelled",
        f"cancelled: parent {ids['alert']} (alert) was cancelled",
    )
    query(database_url, moved, ("pending", ids["done"]))
    assert _status(database_url, ids["alert"])[0] == "cancelled"
    assert _status(database_url, ids["after_alert"])[0] == "cancelled"
    # Retried by hand, the alert re-arms what its cancellation cancelled.
    client.retry(ids["alert"])
    assert _status(database_url, ids["after_alert"]) == ("held", None)
