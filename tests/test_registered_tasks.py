"""A worker claims only the tasks it registered; a job no live worker can run waits, visibly.

Real `worker run` processes on a real PostgreSQL: `testtasks` alone is a worker of one release,
`testtasks nextreleasetasks` one of the next, which adds the `thumbnail` task.
"""

from __future__ import annotations

import psycopg
import pytest
from support import Processes, insert_job, insert_worker, query, wait_for
from support.factories import claim_params

from worker import Client
from worker.db import sql

OLD = ("testtasks",)
NEW = ("testtasks", "nextreleasetasks")
UNSERVED = "SELECT queue, task, jobs, queue_workers FROM worker.unserved_tasks ORDER BY task"


def registered(url: str, pid: int) -> bool:
    return bool(query(url, "SELECT count(*) FROM worker.workers WHERE pid = %s", (pid,))[0][0])


def test_the_old_release_never_fails_a_job_of_a_task_only_the_new_one_has(
    env, database_url, processes: Processes
):
    url = database_url
    client = Client(url)
    old = processes.worker(env, *OLD)
    wait_for(lambda: registered(url, old.pid), message="the old worker to register")
    new_job = client.enqueue("thumbnail", {})
    # A cancel that landed after the job's last look: its claimer settles it (and would run
    # its cleanups), so that too waits for a worker that has the task.
    settling = insert_job(url, task="thumbnail", cancel_requested=True)
    # The old worker claims past them: a job enqueued after them runs.
    assert client.enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=20) == 2
    waiting = "SELECT status, retry_count, error, worker_id FROM worker.jobs WHERE id = %s"
    for job_id in (new_job.job_id, settling):
        assert query(url, waiting, (job_id,)) == [("pending", 0, None, None)]
    assert query(url, UNSERVED) == [("default", "thumbnail", 2, 1)]

    # The roll: the new release joins while the old one still runs, on the same queue.
    new = processes.worker(env, *NEW)
    more = [client.enqueue("thumbnail", {}) for _ in range(20)]
    adds = [client.enqueue("add", {"a": i, "b": 0}) for i in range(20)]
    assert {job.wait_sync(timeout=30) for job in [new_job, *more]} == {new.pid}
    assert [job.wait_sync(timeout=30) for job in adds] == list(range(20))
    wait_for(
        lambda: (
            query(url, "SELECT status FROM worker.jobs WHERE id = %s", (settling,))
            == [("cancelled",)]
        ),
        timeout=20,
        message="the settling job cancelled by the new worker",
    )
    assert query(url, "SELECT count(*) FROM worker.jobs WHERE status = 'failed'") == [(0,)]
    assert query(url, UNSERVED) == []
    assert old.poll() is None and "no task named" not in processes.log(old)


def test_a_typo_in_a_plain_sql_enqueue_stays_pending_and_shows_its_task_name(
    env, database_url, processes: Processes
):
    url = database_url
    processes.worker(env, *OLD)
    ((job_id,),) = query(
        url, "INSERT INTO worker.jobs (task, payload) VALUES ('resze', '{}') RETURNING id::text"
    )
    assert Client(url).enqueue("add", {"a": 1, "b": 2}).wait_sync(timeout=20) == 3
    assert query(
        url, "SELECT status, retry_count, error FROM worker.jobs WHERE id = %s", (job_id,)
    ) == [("pending", 0, None)]
    # One live worker runs the queue, and it did not register `resze`.
    assert query(url, UNSERVED) == [("default", "resze", 1, 1)]


@pytest.mark.parametrize("one_queue", [True, False])
def test_a_job_that_only_settles_is_claimed_only_by_a_worker_with_its_task(database_url, one_queue):
    """While the queue's budget is spent (here: paused), the claim still takes the jobs that
    only settle (a cancel requested), for their cleanups to run: only those of its tasks."""
    url = database_url
    worker_id = insert_worker(url, tasks=("resize",))
    settling = insert_job(url, task="thumbnail", cancel_requested=True)
    query(url, sql.PAUSE_QUEUE, {"name": "default"})
    statement = sql.CLAIM_ONE_QUEUE if one_queue else sql.CLAIM
    queues = ["default"] if one_queue else ["default", "other"]
    with psycopg.connect(url, autocommit=True) as conn:
        lacking = conn.execute(statement, claim_params(worker_id, ["resize"], queues=queues))
        assert lacking.fetchall() == []
        having = claim_params(worker_id, ["resize", "thumbnail"], queues=queues)
        assert [str(row[0]) for row in conn.execute(statement, having).fetchall()] == [settling]
