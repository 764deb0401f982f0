"""Plain SQL: `worker.enqueue(..., depends_on => ARRAY[...])` holds a job until those jobs
have ended, as a workflow's job is held, against a real PostgreSQL."""

from __future__ import annotations

from support import query, status_of

from worker import Client


def _enqueue(url: str, depends_on: list[str]) -> str:
    rows = query(
        url,
        "SELECT worker.enqueue('fan_in', '{}', depends_on => %s::uuid[])::text",
        (depends_on,),
    )
    return str(rows[0][0])


def test_a_job_enqueued_in_sql_with_depends_on_is_held_until_its_parents_end(database_url):
    client = Client(database_url)
    a = client.enqueue("part", {"n": 1}, delay=3600)
    b = client.enqueue("part", {"n": 2}, delay=3600)
    child = _enqueue(database_url, [a.job_id, b.job_id])
    assert status_of(database_url, child) == "held"
    assert query(database_url, "SELECT waiting_on FROM worker.jobs WHERE id = %s", (child,)) == [
        (2,)
    ]
    client.cancel(a.job_id)
    # The default policy: a cancelled parent cancels the child, naming it.
    assert status_of(database_url, child) == "cancelled"
    (error,) = query(database_url, "SELECT error FROM worker.jobs WHERE id = %s", (child,))[0]
    assert error == f"cancelled: parent {a.job_id} was cancelled"


def test_depends_on_a_job_already_completed_is_due_at_once(database_url):
    client = Client(database_url)
    done = client.enqueue("part", {"n": 1})
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', finished_at = now() WHERE id = %s",
        (done.job_id,),
    )
    assert status_of(database_url, _enqueue(database_url, [done.job_id])) == "pending"


def test_enqueue_without_depends_on_is_as_before(database_url):
    (job,) = query(database_url, "SELECT worker.enqueue('add', '{\"a\": 1, \"b\": 2}')::text")[0]
    assert status_of(database_url, job) == "pending"
