"""A workflow's graph: written whole in one transaction or refused whole, and each job held
until its parents have ended, against a real PostgreSQL (parents end by the product's own
statements: cancel, a plain DELETE, the worker's outcome write in `test_workflows.py`)."""

from __future__ import annotations

from uuid import UUID

import psycopg
import pytest
from support import query, status_of

from worker import Client, InvalidWorkflow, JobStatus, Workflow


def _jobs(url: str) -> int:
    return int(query(url, "SELECT count(*) FROM worker.jobs")[0][0])


def test_a_child_is_held_and_takes_no_runnable_slot(database_url):
    wf = Workflow("export")
    a = wf.add("part", {"n": 1})
    b = wf.add("part", {"n": 2})
    c = wf.add("fan_in", {}, after=[a, b])
    handle = wf.enqueue(client=Client(database_url))
    child = handle.jobs[c.name].job_id
    assert status_of(database_url, child) == "held"
    assert handle.status()[JobStatus.HELD] == 1
    assert handle.status()[JobStatus.PENDING] == 2
    # The claim's index covers pending rows only: a held job is never a candidate.
    waiting = query(database_url, "SELECT id, waiting_for FROM worker.held_jobs")
    assert [(str(i), sorted(map(str, w))) for i, w in waiting] == [
        (child, sorted([handle.jobs["part"].job_id, handle.jobs["part.2"].job_id]))
    ]


@pytest.mark.parametrize(
    "build, problem",
    [
        (
            lambda wf: [
                wf.add("part", {}, name="x", after=["y"]),
                wf.add("part", {}, name="y", after=["x"]),
            ],
            "has a cycle through x, y",
        ),
        (
            lambda wf: [wf.add("part", {}, name="x"), wf.add("part", {}, name="x")],
            "node name 'x' is used twice",
        ),
        (
            lambda wf: [wf.add("part", {}, after=[Workflow("other").add("part", {})])],
            "node 'part' belongs to workflow 'other', not this one",
        ),
        (lambda wf: [wf.add("part", {}, after=["nobody"])], "no node is named 'nobody'"),
        (lambda wf: [wf.add("part", {"n": object()})], "node 'part': payload"),
    ],
    ids=["cycle", "duplicate", "foreign-node", "unknown-name", "bad-payload"],
)
def test_a_bad_graph_is_refused_whole_with_nothing_written(database_url, build, problem):
    wf = Workflow("bad")
    wf.add("part", {"n": 0}, name="fine")
    with pytest.raises(InvalidWorkflow, match=problem):
        build(wf)
        wf.enqueue(client=Client(database_url))
    assert _jobs(database_url) == 0
    assert query(database_url, "SELECT count(*) FROM worker.workflows")[0][0] == 0
    assert query(database_url, "SELECT count(*) FROM worker.job_dependencies")[0][0] == 0


def test_a_dependency_on_an_ended_job_resolves_at_once(database_url):
    client = Client(database_url)
    done = client.enqueue("part", {"n": 1})
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', finished_at = now(), "
        "result = '{\"n\": 1}' WHERE id = %s",
        (done.job_id,),
    )
    gone = client.enqueue("part", {"n": 2})
    query(database_url, "DELETE FROM worker.jobs WHERE id = %s", (gone.job_id,))
    wf = Workflow("late")
    ok = wf.add("fan_in", {}, after=[done])
    anyway = wf.add("finalize", {}, after=[done, UUID(gone.job_id)], on_parent_failure="run")
    cancelled = wf.add("fan_in", {}, after=[done, UUID(gone.job_id)])
    handle = wf.enqueue(client=client)
    assert status_of(database_url, handle.jobs[ok.name].job_id) == "pending"
    assert status_of(database_url, handle.jobs[anyway.name].job_id) == "pending"
    child = handle.jobs[cancelled.name].job_id
    assert status_of(database_url, child) == "cancelled"
    (error,) = query(database_url, "SELECT error FROM worker.jobs WHERE id = %s", (child,))[0]
    assert error == f"cancelled: parent {gone.job_id} was deleted"


def test_a_workflow_in_a_callers_transaction_exists_only_if_it_commits(database_url):
    client = Client(database_url)
    wf = Workflow("tx")
    a = wf.add("part", {"n": 1})
    wf.add("fan_in", {}, after=[a])
    with psycopg.connect(database_url) as conn:
        wf.enqueue(client=client, connection=conn)
        conn.rollback()
    assert _jobs(database_url) == 0
    assert query(database_url, "SELECT count(*) FROM worker.job_dependencies")[0][0] == 0
    with psycopg.connect(database_url) as conn:
        handle = wf.enqueue(client=client, connection=conn)
    assert _jobs(database_url) == 2
    assert handle.status()[JobStatus.HELD] == 1


def test_a_key_makes_a_workflow_unique(database_url):
    client = Client(database_url)

    def build() -> Workflow:
        wf = Workflow("nightly", key="nightly-2026-12-05")
        wf.add("part", {"n": 1})
        return wf

    first = build().enqueue(client=client)
    again = build().enqueue(client=client)
    assert (again.id, again.duplicate, first.duplicate) == (first.id, True, False)
    assert list(again.jobs) == ["part"] and _jobs(database_url) == 1


def test_cancelling_a_workflow_cancels_its_jobs_but_its_finalizer_runs(database_url):
    client = Client(database_url)
    wf = Workflow("stop")
    a = wf.add("part", {"n": 1})
    b = wf.add("fan_in", {}, after=[a])
    f = wf.add("finalize", {}, after=[b], on_parent_failure="run")
    handle = wf.enqueue(client=client)
    assert handle.cancel() == 2
    ids = {n: handle.jobs[n.name].job_id for n in (a, b, f)}
    assert status_of(database_url, ids[a]) == "cancelled"
    assert status_of(database_url, ids[b]) == "cancelled"
    # The finalizer's parent ended (cancelled): it is due now, to run as its policy says.
    assert status_of(database_url, ids[f]) == "pending"
    assert Workflow.get(handle.id, client=client).parents == {
        "part": [],
        "fan_in": ["part"],
        "finalize": ["fan_in"],
    }
