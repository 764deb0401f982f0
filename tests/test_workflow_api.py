"""The workflows' HTTP routes against a real `worker api` process: each workflow listed with
its jobs counted, one shown with its jobs and edges, one cancelled; errors as the job routes'."""

from __future__ import annotations

import uuid

from support import Processes
from support.api import start_api

from worker import Client, Workflow

EVERY_STATUS = ["pending", "processing", "completed", "failed", "paused", "cancelled", "held"]


def _counts(**given: int) -> dict[str, int]:
    return {status: given.get(status, 0) for status in EVERY_STATUS}


def test_workflows_are_listed_shown_and_cancelled_over_http(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    wf = Workflow("export", key="export-1")
    first = wf.add("add", {"a": 1, "b": 1}, name="first")
    wf.add("add", {"a": 2, "b": 2}, name="second", after=[first])
    graph = wf.enqueue(client=client)
    batch = client.enqueue_many(
        [("add", {"a": n, "b": 0}) for n in range(2)], on_complete="add", on_failure="add"
    )
    assert batch.on_complete is not None and batch.on_failure is not None
    api = start_api(env, processes)
    with api.client(headers=api.auth()) as http:
        listed = http.get("/workflows").json()["workflows"]
        assert [(w["id"], w["name"], w["key"], w["jobs"]) for w in listed] == [
            (batch.workflow.id, "batch", None, 4),
            (graph.id, "export", "export-1", 2),
        ]
        assert listed[0]["counts"] == _counts(pending=2, held=2)
        assert [
            w["id"] for w in http.get("/workflows", params={"limit": 1}).json()["workflows"]
        ] == [batch.workflow.id]

        shown = http.get(f"/workflows/{batch.workflow.id}").json()
        ids = [job.job_id for job in batch] + [batch.on_complete.job_id, batch.on_failure.job_id]
        assert [(j["id"], j["node"], j["status"]) for j in shown["jobs"]] == [
            (ids[0], "0", "pending"),
            (ids[1], "1", "pending"),
            (ids[2], "on_complete", "held"),
            (ids[3], "on_failure", "held"),
        ]
        assert shown["edges"] == [
            {"parent": parent, "child": child} for child in ids[2:] for parent in ids[:2]
        ]
        assert shown["counts"] == _counts(pending=2, held=2)

        # The batch's jobs are cancelled; its callbacks are released by that, to run.
        cancelled = http.post(f"/workflows/{batch.workflow.id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json() == {
            "id": batch.workflow.id,
            "changed": 2,
            "counts": _counts(cancelled=2, pending=2),
        }
        again = http.post(f"/workflows/{batch.workflow.id}/cancel").json()
        assert again["changed"] == 0
        assert http.get(f"/workflows/{graph.id}").json()["counts"] == _counts(pending=1, held=1)


def test_workflow_routes_refuse_as_the_job_routes_do(env, database_url, processes: Processes):
    graph = Workflow("one")
    graph.add("add", {"a": 1, "b": 1})
    workflow_id = graph.enqueue(client=Client(database_url)).id
    unknown = str(uuid.uuid4())
    api = start_api(env, processes)
    with api.client(headers=api.auth()) as http:
        for params, reason in [
            ({"limit": "0"}, "invalid limit"),
            ({"limit": "many"}, "not an integer"),
            ({"colour": "red"}, "unknown query parameter: colour"),
        ]:
            answer = http.get("/workflows", params=params)
            assert answer.status_code == 422 and reason in answer.json()["error"], params
        for method, path in [
            ("GET", f"/workflows/{unknown}"),
            ("POST", f"/workflows/{unknown}/cancel"),
            ("GET", "/workflows/not-an-id"),
            ("POST", "/workflows/not-an-id/cancel"),
        ]:
            answer = http.request(method, path)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["error"].startswith("no workflow")
    with api.client() as http:
        refused = http.post(f"/workflows/{workflow_id}/cancel")
        assert refused.status_code == 401, refused.text
    assert Workflow.get(workflow_id, client=Client(database_url)).status()["pending"] == 1
