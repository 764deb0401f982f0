"""The sizes of workflow the docs promise, run by real `worker run` processes against a real
PostgreSQL: a fan-out and fan-in of 10,000 children, and a chain of 1,000 jobs whose head
fails (cancelling the rest in its outcome write), then is retried (re-arming all of them)."""

from __future__ import annotations

from support import Processes, query, wait_for

from worker import Client, JobStatus, Workflow

WIDTH = 10_000
DEPTH = 1_000


def test_a_fan_out_and_fan_in_of_10000_children_each_run_once(
    env, database_url, processes: Processes
):
    wf = Workflow("wide")
    root = wf.add("part", {"n": 0}, name="root")
    children = [wf.add("part", {"n": n}, name=f"child_{n}", after=[root]) for n in range(WIDTH)]
    wf.add("fan_in", {}, name="sink", after=children)
    handle = wf.enqueue(client=Client(database_url))
    for _ in range(2):
        processes.worker(env, "workflowtasks", extra={"WORKER_CONCURRENCY": "20"})
    sink = handle.jobs["sink"]
    sink.wait_sync(timeout=300)
    assert handle.status()[JobStatus.COMPLETED] == WIDTH + 2
    (result,) = query(database_url, "SELECT result FROM worker.jobs WHERE id = %s", (sink.job_id,))
    # Every child's result, read by the one job that waited for all of them.
    assert result[0]["sum"] == sum(range(WIDTH))
    assert result[0]["parents"] == [c.name for c in children]
    runs = query(database_url, "SELECT kind FROM effects WHERE job = %s", (sink.job_id,))
    assert runs == [("ran:0",)]
    retried = "SELECT count(*) FROM worker.jobs WHERE retry_count > 0 OR started_at IS NULL"
    assert query(database_url, retried) == [(0,)]


def test_a_chain_of_1000_is_cancelled_by_its_head_then_re_armed_and_run_in_order(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    wf = Workflow("deep")
    node = wf.add("flaky", {"n": 0}, name="link_0", max_retries=0)
    for n in range(1, DEPTH):
        node = wf.add("part", {"n": n}, name=f"link_{n}", after=[node])
    handle = wf.enqueue(client=client)
    ids = [job.job_id for job in handle.jobs.values()]
    processes.worker(env, "workflowtasks")

    # The head's failure cancels the 999 below it in the transaction of its outcome.
    counts = handle.wait_sync(timeout=120)
    assert (counts[JobStatus.FAILED], counts[JobStatus.CANCELLED]) == (1, DEPTH - 1)

    query(database_url, "INSERT INTO effects (job, kind) VALUES (%s, 'fix')", (ids[0],))
    client.retry(ids[0])
    wait_for(
        lambda: handle.status()[JobStatus.COMPLETED] == DEPTH,
        timeout=300,
        message="the chain to complete",
    )
    rows = query(
        database_url,
        "SELECT started_at, finished_at FROM worker.jobs WHERE id = ANY(%s::uuid[]) "
        "ORDER BY array_position(%s::uuid[], id)",
        (ids, ids),
    )
    # Each link started only once the one before it had finished.
    assert all(rows[n][0] >= rows[n - 1][1] for n in range(1, DEPTH))
