"""Workflows run by real `worker run` processes against a real PostgreSQL: a child runs once,
after every parent's outcome is committed (`fan_in_race`), and each parent outcome under each
failure policy gives the documented result."""

from __future__ import annotations

import psycopg
import pytest
from support import Processes, query, wait_for
from workflowtasks import GATE

from worker import Client, JobStatus, Workflow

# Gated repetitions of the fan-in race, each 50 parents let go at once.
ROUNDS = 100


def _row(url: str, job_id: str) -> tuple[str, str | None, object]:
    (row,) = query(url, "SELECT status, error, result FROM worker.jobs WHERE id = %s", (job_id,))
    return row[0], row[1], row[2]


def _runs(url: str, job_id: str) -> list[str]:
    rows = query(url, "SELECT kind FROM effects WHERE job = %s ORDER BY at", (job_id,))
    return [str(r[0]) for r in rows]


def test_a_fan_in_reads_every_parent_result_in_order(env, database_url, processes: Processes):
    client = Client(database_url)
    wf = Workflow("sum")
    parts = [wf.add("part", {"n": n}) for n in range(1, 6)]
    total = wf.add("fan_in", {}, after=list(reversed(parts)))
    handle = wf.enqueue(client=client)
    processes.worker(env, "workflowtasks")
    counts = handle.wait_sync(timeout=30)
    assert counts[JobStatus.COMPLETED] == 6
    child = handle.jobs[total.name].job_id
    # Parents in the order they were added to the graph, whatever order `after` named them in.
    assert _row(database_url, child)[2] == {
        "sum": 15,
        "parents": ["part", "part.2", "part.3", "part.4", "part.5"],
    }
    assert _runs(database_url, child) == ["ran:0"]


def _end(url: str, client: Client, how: str, job_id: str) -> None:
    """End a parent (enqueued with a long delay, so no worker starts it) the way `how` says."""
    if how == "cancelled":
        assert client.cancel(job_id) == JobStatus.CANCELLED
    elif how == "deleted":
        query(url, "DELETE FROM worker.jobs WHERE id = %s", (job_id,))
    else:  # completed or failed: run now, by the worker
        query(url, "UPDATE worker.jobs SET run_at = now() WHERE id = %s", (job_id,))


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled", "deleted"])
def test_each_parent_outcome_under_each_policy(env, database_url, processes, outcome):
    client = Client(database_url)
    wf = Workflow("policies")
    other = wf.add("part", {"n": 1}, name="other")
    task = "boom" if outcome == "failed" else "part"
    parent = wf.add(task, {"n": 2}, name="parent", max_retries=0, delay=3600)
    cancels = wf.add("fan_in", {}, name="cancels", after=[other, parent])
    wf.add("finalize", {}, name="runs", after=[other, parent], on_parent_failure="run")
    wf.add(
        "finalize", {}, name="if_failed", after=[other, parent], on_parent_failure="run_if_failed"
    )
    wf.add("fan_in", {}, name="grandchild", after=[cancels])
    handle = wf.enqueue(client=client)
    processes.worker(env, "workflowtasks")
    other_id = handle.jobs[other.name].job_id
    wait_for(lambda: _row(database_url, other_id)[0] == "completed", message="other completed")
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    assert _row(database_url, ids["cancels"])[0] == "held"
    assert _row(database_url, ids["runs"])[0] == "held"
    _end(database_url, client, outcome, ids["parent"])
    handle.wait_sync(timeout=30)

    status, _, result = _row(database_url, ids["runs"])
    assert status == "completed"
    # A deleted parent's row is gone, its node name with it: it is named by its id.
    named = ids["parent"] if outcome == "deleted" else "parent"
    assert result == {"other": "completed", named: outcome}
    assert _runs(database_url, ids["runs"]) == ["finalized"]
    if outcome == "completed":
        assert _row(database_url, ids["if_failed"])[:2] == (
            "cancelled",
            "cancelled: not needed, every parent completed",
        )
        assert _runs(database_url, ids["if_failed"]) == []
    else:
        assert _row(database_url, ids["if_failed"]) == ("completed", None, result)
        assert _runs(database_url, ids["if_failed"]) == ["finalized"]
    if outcome == "completed":
        assert _row(database_url, ids["cancels"])[:2] == ("completed", None)
        assert _row(database_url, ids["grandchild"])[0] == "completed"
        return
    status, error, _ = _row(database_url, ids["cancels"])
    assert (status, error) == (
        "cancelled",
        f"cancelled: parent {ids['parent']}"
        f"{'' if outcome == 'deleted' else ' (parent)'}"
        f" was {outcome}",
    )
    assert _runs(database_url, ids["cancels"]) == []
    # Its own held child follows in the same transaction, naming the parent it waited for.
    status, error, _ = _row(database_url, ids["grandchild"])
    assert (status, error) == (
        "cancelled",
        f"cancelled: parent {ids['cancels']} (cancels) was cancelled",
    )


def _at_gate(url: str) -> int:
    """How many parents wait at the gate: each a running job blocked on its shared lock."""
    return int(
        query(
            url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND objid = %s AND NOT granted",
            (GATE,),
        )[0][0]
    )


def _gated_round(url: str, client: Client, lock: psycopg.Connection, width: int) -> str:
    """One workflow of `width` parents, every one running and waiting at the gate, then let
    go at once; returns the child's id once it has ended."""
    wf = Workflow("race")
    parts = [wf.add("part", {"n": n, "gate": True}) for n in range(width)]
    child = wf.add("fan_in", {}, after=parts)
    lock.execute("SELECT pg_advisory_lock(%s)", (GATE,))
    handle = wf.enqueue(client=client)
    wait_for(lambda: _at_gate(url) == width, message=f"{width} parents at the gate")
    lock.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    job = handle.jobs[child.name]
    job.wait_sync(timeout=30)
    return job.job_id


def test_fan_in_race(env, database_url, processes: Processes):
    """50 parents ending at the same moment across 3 worker processes: each child runs
    exactly once, and never before the last parent's outcome is committed. Gated rounds (every
    parent running, let go at once), then 100 workflows of 50 parents enqueued together."""
    client = Client(database_url)
    for _ in range(3):
        processes.worker(env, "workflowtasks", extra={"WORKER_CONCURRENCY": "20"})
    children: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as lock:
        for _ in range(ROUNDS):
            children.append(_gated_round(database_url, client, lock, 50))
    wide = [Workflow("wide") for _ in range(100)]
    for wf in wide:
        parts = [wf.add("part", {"n": n}) for n in range(50)]
        wf.add("fan_in", {}, name="child", after=parts)
    children += [wf.enqueue(client=client).jobs["child"].job_id for wf in wide]

    def all_ended() -> bool:
        (n,) = query(
            database_url,
            "SELECT count(*) FROM worker.jobs "
            "WHERE status NOT IN ('completed', 'failed', 'cancelled')",
        )[0]
        return n == 0

    wait_for(all_ended, timeout=120, message="every workflow to end")
    runs = query(database_url, "SELECT job, array_agg(kind) FROM effects GROUP BY job")
    ran = {str(job): kinds for job, kinds in runs}
    assert {c: ran.get(c) for c in children} == {c: ["ran:0"] for c in children}
    assert (
        query(database_url, "SELECT count(*) FROM worker.jobs WHERE status <> 'completed'")[0][0]
        == 0
    )


def test_a_cancel_racing_the_last_parent_leaves_the_child_run_or_cancelled(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    processes.worker(env, "workflowtasks", extra={"WORKER_CONCURRENCY": "20"})
    children = []
    with psycopg.connect(database_url, autocommit=True) as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        for _ in range(20):
            wf = Workflow("raced")
            parent = wf.add("part", {"n": 1, "gate": True})
            child = wf.add("fan_in", {}, after=[parent])
            children.append(wf.enqueue(client=client).jobs[child.name].job_id)
        wait_for(
            lambda: (
                query(database_url, "SELECT count(*) FROM worker.jobs WHERE status = 'processing'")[
                    0
                ][0]
                == 20
            ),
            message="20 parents running at the gate",
        )
        lock.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        for child in children:  # while their parents' outcomes are being written
            client.cancel(child)
    wait_for(
        lambda: (
            query(
                database_url,
                "SELECT count(*) FROM worker.jobs WHERE status NOT IN ('completed', 'cancelled')",
            )[0][0]
            == 0
        ),
        message="every job completed or cancelled",
    )
    statuses = {_row(database_url, c)[0] for c in children}
    assert statuses <= {"completed", "cancelled"}
    assert query(database_url, "SELECT count(*) FROM worker.held_jobs")[0][0] == 0
