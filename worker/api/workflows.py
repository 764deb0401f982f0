"""The workflows' routes: each workflow with its jobs counted, one with its jobs and edges, and
the cancel of a whole graph (a batch with callbacks is a workflow named `batch`).

    GET  /workflows?limit=50         newest first, each with its jobs counted by status
    GET  /workflows/{id}             its jobs (node, task, status, error) and edges
    POST /workflows/{id}/cancel      every job not ended, but those its parents' outcomes settle

Answers and errors are those of the job routes: ids are UUIDs, an unknown or malformed id is a
404 `{"error": "no workflow ..."}`, a bad limit a 422 naming it. What this does not do: it
enqueues no workflow (a graph is written from Python, `Workflow.enqueue`), and it does not
page past the newest `MAX_PAGE` workflows.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from worker.api.errors import json_response
from worker.api.params import DEFAULT_PAGE, MAX_PAGE, ApiError, int_param, path_job_id
from worker.client.workflows import WorkflowHandle, WorkflowNotFound, list_workflows_async
from worker.models import JobStatus

if TYPE_CHECKING:
    from worker.api.base import ApiBase

_COUNTS = Field(description="Its jobs per status (every status is listed).")


class WorkflowSummaryOut(BaseModel):
    """One row of `GET /workflows`."""

    id: str
    name: str
    key: str | None = None
    created_at: datetime
    jobs: int
    counts: dict[JobStatus, int] = _COUNTS


class WorkflowList(BaseModel):
    """The newest workflows first."""

    workflows: list[WorkflowSummaryOut]


class WorkflowJobOut(BaseModel):
    """One job of a workflow, in the order its graph was added."""

    id: str
    node: str = Field(description="Its name in the workflow (a batch's jobs: their index).")
    task: str
    queue: str
    status: JobStatus
    error: str | None = None


class EdgeOut(BaseModel):
    """The child runs once the parent has ended (a parent outside the workflow by its id)."""

    parent: str
    child: str


class WorkflowOut(BaseModel):
    """`GET /workflows/{id}`: the workflow, its jobs and the edges between them."""

    id: str
    name: str
    key: str | None = None
    counts: dict[JobStatus, int] = _COUNTS
    jobs: list[WorkflowJobOut]
    edges: list[EdgeOut]


class WorkflowCancelOut(BaseModel):
    """`POST /workflows/{id}/cancel`: how many jobs were cancelled or asked to stop (a running
    job stops at its next stage boundary), and the counts right after."""

    id: str
    changed: int
    counts: dict[JobStatus, int] = _COUNTS


def _counts(statuses: list[JobStatus]) -> dict[JobStatus, int]:
    return {**dict.fromkeys(JobStatus, 0), **Counter(statuses)}


class Workflows:
    """The handlers of the workflows' routes, over the API's client."""

    def __init__(self, api: ApiBase) -> None:
        self.api = api

    async def _read(self, request: Request) -> WorkflowHandle:
        workflow_id = path_job_id(request, "workflow")
        try:
            return await WorkflowHandle.read_async(workflow_id, self.api.client)
        except WorkflowNotFound as exc:
            raise ApiError(404, str(exc)) from None

    async def summaries(self, request: Request) -> Response:
        unknown = set(request.query_params) - {"limit"}
        if unknown:
            raise ApiError(422, f"unknown query parameter: {', '.join(sorted(unknown))}")
        limit = int_param(request.query_params.get("limit"), "limit", 1, MAX_PAGE)
        found = await list_workflows_async(self.api.client, limit or DEFAULT_PAGE)
        rows = [
            WorkflowSummaryOut(
                id=w.id,
                name=w.name,
                key=w.key,
                created_at=w.created_at,
                jobs=w.jobs,
                counts=w.counts,
            )
            for w in found
        ]
        return json_response(WorkflowList(workflows=rows))

    async def show(self, request: Request) -> Response:
        handle = await self._read(request)
        ids = {node: job.job_id for node, job in handle.jobs.items()}
        jobs = [
            WorkflowJobOut(
                id=job.job_id,
                node=node,
                task=job.task,
                queue=job.queue,
                status=job.status,
                error=job.error,
            )
            for node, job in handle.jobs.items()
        ]
        edges = [
            EdgeOut(parent=ids.get(parent, parent), child=ids[child])
            for child, parents in handle.parents.items()
            for parent in parents
        ]
        return json_response(
            WorkflowOut(
                id=handle.id,
                name=handle.name,
                key=handle.key,
                counts=_counts([job.status for job in handle.jobs.values()]),
                jobs=jobs,
                edges=edges,
            )
        )

    async def cancel(self, request: Request) -> Response:
        self.api.guard(request)
        await self.api.body(request)  # none is expected; still bounded, and JSON if any
        handle = await self._read(request)
        changed = await handle.cancel_async()
        counts = await handle.status_async()
        return json_response(WorkflowCancelOut(id=handle.id, changed=changed, counts=counts))


def routes(api: ApiBase) -> list[Route]:
    """The workflows' routes, for `create_app`."""
    w = Workflows(api)
    return [
        Route("/workflows", w.summaries, methods=["GET"]),
        Route("/workflows/{id}", w.show, methods=["GET"]),
        Route("/workflows/{id}/cancel", w.cancel, methods=["POST"]),
    ]
