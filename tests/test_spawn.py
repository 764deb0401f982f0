"""Children spawned from a running stage, against a real PostgreSQL and real `worker run`
processes: one child per key however often the stage runs, a waiting stage holds no slot, the
next stage reads every child's result, and a child's failure follows the spawner's policy."""

from __future__ import annotations

import json

import psycopg
import pytest
from spawntasks import GATE
from support import Processes, query, wait_for

from worker import Client, JobStatus, Workflow
from worker.client.spawn import child_id


def _row(url: str, job_id: str) -> tuple[str, str | None, object]:
    (row,) = query(url, "SELECT status, error, result FROM worker.jobs WHERE id = %s", (job_id,))
    return row[0], row[1], row[2]


def _effects(url: str, job_id: str) -> list[str]:
    rows = query(url, "SELECT kind FROM effects WHERE job = %s ORDER BY at", (job_id,))
    return [str(r[0]) for r in rows]


def _children(url: str, spawner: str) -> list[tuple[str, str, str]]:
    """The spawner's children as its edges record them: id, key, status, in spawn order."""
    rows = query(
        url,
        "SELECT d.parent_id::text, d.spawn_key, j.status FROM worker.job_dependencies AS d "
        "JOIN worker.jobs AS j ON j.id = d.parent_id "
        "WHERE d.child_id = %s AND d.spawn_order IS NOT NULL ORDER BY d.spawn_order",
        (spawner,),
    )
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def _runs(url: str, ids: list[str]) -> int:
    rows = query(url, "SELECT count(*) FROM effects WHERE job = ANY(%s) AND kind = 'ran'", (ids,))
    return int(rows[0][0])


def test_the_next_stage_reads_every_child_result_in_the_order_spawned(
    env, database_url, processes: Processes
):
    job = Client(database_url).enqueue("fan_out", {"parts": 5})
    processes.worker(env, "spawntasks")
    wait_for(lambda: _row(database_url, job.job_id)[0] == "completed", message="fan_out")
    _, _, result = _row(database_url, job.job_id)
    assert result == {
        "split": {"parts": 5},
        "keys": [f"part-{i}" for i in range(5)],
        "statuses": ["completed"] * 5,
        "sum": 0 + 1 + 4 + 9 + 16,
    }
    assert _effects(database_url, job.job_id) == ["spawned:1:5:0", "gathered"]
    children = _children(database_url, job.job_id)
    assert _runs(database_url, [c[0] for c in children]) == 5
    # The children joined a workflow made for the spawner, named for it.
    (flow,) = query(
        database_url,
        "SELECT w.name, count(j.id) FROM worker.jobs AS s JOIN worker.workflows AS w "
        "ON w.id = s.workflow_id JOIN worker.jobs AS j ON j.workflow_id = w.id "
        "WHERE s.id = %s GROUP BY w.name",
        (job.job_id,),
    )
    assert flow == ("fan_out", 6)


def test_a_waiting_stage_holds_no_worker_slot(env, database_url, processes: Processes):
    """With one slot, the child can run only once its spawner gave the slot back."""
    with psycopg.connect(database_url, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        job = Client(database_url).enqueue("fan_out", {"parts": 1, "gate": True})
        processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "1"})
        wait_for(lambda: _children(database_url, job.job_id), message="the child spawned")
        ((child, _, _),) = _children(database_url, job.job_id)
        wait_for(lambda: _effects(database_url, child) == ["ran"], message="the child running")
        (held,) = query(
            database_url,
            "SELECT status, waiting_on, worker_id FROM worker.jobs WHERE id = %s",
            (job.job_id,),
        )
        assert held[0] == "held" and held[1] == 1
        assert _row(database_url, child)[0] == "processing"
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    wait_for(lambda: _row(database_url, job.job_id)[0] == "completed", message="fan_out")
    assert _row(database_url, job.job_id)[2]["sum"] == 0


def test_a_child_that_waits_for_its_own_children_keeps_its_spawner_waiting(
    env, database_url, processes: Processes
):
    """A held child has not ended: its spawner waits until the child's own children have
    ended and the child has gathered them, all on one worker slot."""
    job = Client(database_url).enqueue("fan_out", {"parts": 1, "nest": 3})
    processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "1"})
    wait_for(lambda: _row(database_url, job.job_id)[0] == "completed", message="fan_out")
    result = _row(database_url, job.job_id)[2]
    assert result["keys"] == ["part-0", "inner"]
    assert result["sum"] == 0 + (0 + 1 + 4)
    inner = _children(database_url, job.job_id)[1][0]
    (order,) = query(
        database_url,
        "SELECT array_agg(job ORDER BY at) FROM effects WHERE kind = 'gathered'",
    )
    assert order[0] == [inner, job.job_id]


def test_a_pipeline_waits_for_its_children_again_in_a_later_stage(env, database_url, processes):
    """The second wait counts the children spawned before, ended already, and waits for the
    new ones only; the last stage reads all of them."""
    job = Client(database_url).enqueue("two_rounds", {})
    processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "1"})
    wait_for(lambda: _row(database_url, job.job_id)[0] == "completed", message="two_rounds")
    assert _row(database_url, job.job_id)[2] == {
        "ended_before": ["a", "b"],
        "keys": ["a", "b", "c", "d"],
        "sum": 1 + 4 + 9 + 16,
    }
    orders = query(
        database_url,
        "SELECT spawn_order FROM worker.job_dependencies WHERE child_id = %s ORDER BY 1",
        (job.job_id,),
    )
    assert [r[0] for r in orders] == [1, 2, 3, 4]  # each child its own place, across stages


def test_a_stage_killed_after_spawning_spawns_no_second_child(
    env, database_url, processes: Processes
):
    """The worker is killed (SIGKILL) after the spawn committed; the stage runs again on
    another worker once the first one's lease ran out, and finds every child it spawned."""
    job = Client(database_url).enqueue("fan_out", {"parts": 3, "die": True})
    processes.worker(env, "spawntasks")
    wait_for(
        lambda: _effects(database_url, job.job_id) == ["spawned:1:3:0"], message="the first spawn"
    )
    processes.worker(env, "spawntasks")  # rescues the spawner after the lease
    wait_for(
        lambda: _row(database_url, job.job_id)[0] == "completed", timeout=60, message="fan_out"
    )
    # The second attempt's spawn found all three children; none was written twice.
    assert _effects(database_url, job.job_id) == ["spawned:1:3:0", "spawned:2:3:3", "gathered"]
    children = _children(database_url, job.job_id)
    assert [key for _, key, _ in children] == ["part-0", "part-1", "part-2"]
    (n,) = query(
        database_url,
        "SELECT count(*) FROM worker.jobs WHERE task = 'square'",
    )
    assert n[0] == 3
    assert _row(database_url, job.job_id)[2]["sum"] == 0 + 1 + 4


def test_a_spawn_again_with_a_key_returns_the_first_child(env, database_url, processes):
    job = Client(database_url).enqueue("spawns_one", {})
    processes.worker(env, "spawntasks")
    wait_for(lambda: _row(database_url, job.job_id)[0] == "completed", message="spawns_one")
    result = _row(database_url, job.job_id)[2]
    assert result["first"] == result["again"] and result["duplicate"] is True
    ((child, key, _),) = _children(database_url, job.job_id)
    assert (child, key) == (result["first"], "only")
    wait_for(lambda: _row(database_url, child)[0] == "completed", message="the child")
    # The payload of the first spawn is the one kept.
    assert _row(database_url, child)[2] == {"square": 9}


@pytest.mark.parametrize("when", ["before_the_wait", "while_waiting"])
@pytest.mark.parametrize("policy", ["cancel", "run"])
def test_a_failed_child_under_each_policy(env, database_url, processes, policy, when):
    """A child that fails for good cancels its waiting spawner (`cancel`, the default) or is
    read as failed by the next stage (`run`), whether it ended before the stage waited or
    while its job was held."""
    payload = {"parts": 3, "fail": [1]}
    if when == "before_the_wait":
        payload["wait_until_ended"] = True
    else:
        payload["gate"] = True
    wf = Workflow("failing-child")
    wf.add("fan_out", payload, on_parent_failure=policy)
    with psycopg.connect(database_url, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        handle = wf.enqueue(client=Client(database_url))
        spawner = handle.jobs["fan_out"].job_id
        processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "4"})
        if when == "while_waiting":
            wait_for(lambda: _row(database_url, spawner)[0] == "held", message="held")
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        handle.wait_sync(timeout=30)
    wait_for(lambda: _row(database_url, spawner)[0] in ("completed", "cancelled"), message="end")
    status, error, result = _row(database_url, spawner)
    failed = _children(database_url, spawner)[1][0]
    if policy == "cancel":
        assert status == "cancelled"
        assert error == f"cancelled: parent {failed} (fan_out/part-1) was failed"
        assert "gathered" not in _effects(database_url, spawner)
    else:
        assert status == "completed"
        assert result["statuses"] == ["completed", "failed", "completed"]
        assert result["sum"] == 0 + 4


def test_hundreds_of_children_are_spawned_in_one_statement(env, database_url, processes):
    job = Client(database_url).enqueue("fan_out", {"parts": 300})
    processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "8"})
    wait_for(
        lambda: _row(database_url, job.job_id)[0] == "completed", timeout=120, message="fan_out"
    )
    result = _row(database_url, job.job_id)[2]
    assert result["keys"] == [f"part-{i}" for i in range(300)]
    assert result["sum"] == sum(i * i for i in range(300))
    # One statement, one transaction: every child was created at the same transaction time.
    (row,) = query(
        database_url,
        "SELECT count(*), count(DISTINCT created_at) FROM worker.jobs WHERE task = 'square'",
    )
    assert row == (300, 1)


def test_a_task_that_waits_for_its_children_fails_with_a_clear_error(env, database_url, processes):
    job = Client(database_url).enqueue("waits_in_a_task", {}, max_retries=0)
    processes.worker(env, "spawntasks")
    wait_for(lambda: _row(database_url, job.job_id)[0] == "failed", message="failed")
    assert _row(database_url, job.job_id)[1] == (
        "wait_for_children() ends a pipeline's stage: a task cannot wait for its children"
    )
    assert JobStatus(_row(database_url, job.job_id)[0]) is JobStatus.FAILED


def _spawn_in_sql(conn: psycopg.Connection, spawner: str, keys: list[str]) -> list[str]:
    """What `ctx.spawn_many` sends, for a spawner marked running by hand."""
    ids = [child_id(spawner, k) for k in keys]
    jobs = [
        {"i": i, "t": "square", "p": {}, "q": "default", "pr": 0, "ra": None, "d": 0}
        | {"mr": None, "u": None, "ck": None}
        for i in ids
    ]
    children = [{"i": i, "k": k, "o": n} for n, (i, k) in enumerate(zip(ids, keys, strict=True))]
    conn.execute(
        "SELECT * FROM worker.spawn(%s, %s, %s)", (spawner, json.dumps(jobs), json.dumps(children))
    )
    return ids


def test_a_child_ended_by_the_write_that_holds_its_spawner_is_counted_once(database_url):
    """One statement ends a child and moves its spawner to `held` (a worker's outcome batch
    holding both): the spawner waits for the other child only, then is released by it."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        spawner = Client(database_url).enqueue("fan_out", {}).job_id
        conn.execute(
            "UPDATE worker.jobs SET status = 'processing', started_at = now(), "
            "worker_id = gen_random_uuid() WHERE id = %s",
            (spawner,),
        )
        first, second = _spawn_in_sql(conn, spawner, ["a", "b"])
        conn.execute(
            "UPDATE worker.jobs SET status = CASE WHEN id = %(spawner)s THEN 'held' "
            "ELSE 'completed' END, result = CASE WHEN id = %(first)s THEN '1'::jsonb END, "
            "finished_at = CASE WHEN id = %(first)s THEN now() END "
            "WHERE id IN (%(spawner)s, %(first)s)",
            {"spawner": spawner, "first": first},
        )
        (held,) = query(
            database_url, "SELECT status, waiting_on FROM worker.jobs WHERE id = %s", (spawner,)
        )
        assert held == ("held", 1)
        conn.execute(
            "UPDATE worker.jobs SET status = 'completed', result = '1', finished_at = now() "
            "WHERE id = %s",
            (second,),
        )
    assert _row(database_url, spawner)[0] == "pending"


def test_a_retried_child_re_arms_the_spawner_its_failure_cancelled(env, database_url, processes):
    """A child that fails for good cancels its waiting spawner; retried and completed, it
    re-arms the spawner, which goes on to the stage after its wait, once, and reads every
    child completed (migration 0018)."""
    wf = Workflow("re-armed spawner")
    wf.add("fan_out", {"parts": 3, "fail": [1], "wait_until_ended": True})
    handle = wf.enqueue(client=Client(database_url))
    spawner = handle.jobs["fan_out"].job_id
    processes.worker(env, "spawntasks", extra={"WORKER_CONCURRENCY": "4"})
    wait_for(lambda: _row(database_url, spawner)[0] == "cancelled", message="cancelled")
    failed = _children(database_url, spawner)[1][0]
    assert (
        _row(database_url, spawner)[1] == f"cancelled: parent {failed} (fan_out/part-1) was failed"
    )
    query(database_url, "INSERT INTO effects (job, kind) VALUES (%s, 'fix')", (failed,))
    Client(database_url).retry(failed)
    # Held again by the retry itself (the worker may have let it go since), its error cleared.
    status, error, _ = _row(database_url, spawner)
    assert status in ("held", "pending", "processing", "completed") and error is None
    wait_for(lambda: _row(database_url, spawner)[0] == "completed", message="completed")
    result = _row(database_url, spawner)[2]
    assert result["statuses"] == ["completed"] * 3
    assert result["sum"] == 0 + 1 + 4
    assert result["split"] == {"parts": 3}
    kinds = _effects(database_url, spawner)
    assert [k for k in kinds if k.startswith("spawned:")] == ["spawned:1:3:0"]
    assert kinds.count("gathered") == 1
