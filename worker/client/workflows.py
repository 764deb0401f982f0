"""`WorkflowHandle`: a workflow enqueued, valid in any process: its jobs, their counts by
status, a wait for all of them to end, and a cancel of the whole graph. Beside the `Job`
handle, as both read, wait and cancel through the client that made them; a graph is
declared and written by `worker.workflow`, a batch with callbacks by `enqueue_many`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeGuard, cast

from worker.client.errors import JobNotFound
from worker.client.job import CLIENTS, AsyncReader, Job, JobError, Reader, new_job
from worker.client.validation import JobSpec
from worker.client.waiting import deadline_of, time_left
from worker.db import sql
from worker.db.client_async import AsyncDatabase
from worker.db.client_sync import Database
from worker.models import JobStatus


class WorkflowReader(Reader, Protocol):
    """What a handle reads and cancels through: a blocking client (`worker.Client`)."""

    _db: Database


class AsyncWorkflowReader(AsyncReader, Protocol):
    """What a handle reads through by awaiting: an asyncio client (`worker.AsyncClient`)."""

    _db: AsyncDatabase


def _awaited(client: WorkflowReader | AsyncWorkflowReader) -> TypeGuard[AsyncWorkflowReader]:
    return inspect.iscoroutinefunction(client.get)


class WorkflowNotFound(LookupError):
    """No workflow has the id asked for."""


def _counts(row: Any) -> dict[JobStatus, int]:
    return {status: int(getattr(row, status.value)) for status in JobStatus}


@dataclass
class WorkflowHandle:
    """A handle on one workflow: from `Workflow.enqueue()` or `Workflow.get(id)`.

    >>> handle = wf.enqueue()                              # doctest: +SKIP
    >>> handle.wait_sync(timeout=60)[JobStatus.COMPLETED]  # doctest: +SKIP
    14
    """

    id: str
    name: str
    key: str | None
    # Each job's handle by node name, in the order the nodes were added.
    jobs: dict[str, Job]
    client: WorkflowReader | AsyncWorkflowReader = field(repr=False, compare=False)
    # The enqueue found a workflow holding its key: this is that workflow.
    duplicate: bool = False
    # Each node's parents, by node name (a parent outside the workflow by its job id); read
    # back by `Workflow.get`, empty on a handle fresh from an enqueue.
    parents: dict[str, list[str]] = field(default_factory=dict)

    def _sync(self) -> WorkflowReader:
        """The client that made the handle, or a blocking one for its database."""
        if _awaited(self.client):
            assert CLIENTS.for_url is not None, "worker.client sets it when imported"
            return cast(WorkflowReader, CLIENTS.for_url(self.client.url))
        return cast(WorkflowReader, self.client)

    def _async(self) -> AsyncWorkflowReader | None:
        """The client that made the handle, if it is an asyncio client."""
        return self.client if _awaited(self.client) else None

    @classmethod
    def read(cls, workflow_id: str, client: WorkflowReader) -> WorkflowHandle:
        """The workflow as it stands, with a handle on each of its jobs."""
        found = client._db.run(sql.GET_WORKFLOW, {"id": workflow_id})
        if not found:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        return cls._of(found[0], client._db.run(sql.WORKFLOW_JOBS, {"id": workflow_id}), client)

    @classmethod
    async def read_async(cls, workflow_id: str, client: AsyncWorkflowReader) -> WorkflowHandle:
        """`read` on an asyncio client."""
        found = await client._db.run(sql.GET_WORKFLOW, {"id": workflow_id})
        if not found:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        job_rows = await client._db.run(sql.WORKFLOW_JOBS, {"id": workflow_id})
        return cls._of(found[0], job_rows, client)

    @classmethod
    def _of(
        cls, row: Any, job_rows: Any, client: WorkflowReader | AsyncWorkflowReader
    ) -> WorkflowHandle:
        """The handle of `sql.GET_WORKFLOW`'s row and `sql.WORKFLOW_JOBS`' rows."""
        jobs: dict[str, Job] = {}
        parent_ids: dict[str, list[str]] = {}
        for j in job_rows:
            spec = JobSpec(
                j.task,
                j.payload,
                j.queue,
                j.priority,
                max_retries=j.max_retries,
                concurrency_key=j.concurrency_key,
            )
            job = jobs[j.node] = new_job(j.id, spec, client)
            job.status, job.error = JobStatus(j.status), j.error
            parent_ids[j.node] = [str(p) for p in j.parents]
        names = {job.job_id: name for name, job in jobs.items()}
        parents = {node: [names.get(p, p) for p in ps] for node, ps in parent_ids.items()}
        return cls(str(row.id), row.name, row.key, jobs, client, parents=parents)

    def refreshed(self) -> WorkflowHandle:
        """The workflow re-read (a new handle; this one's `duplicate` is kept)."""
        handle = self.read(self.id, self._sync())
        handle.duplicate = self.duplicate
        return handle

    async def refreshed_async(self) -> WorkflowHandle:
        return await asyncio.to_thread(self.refreshed)

    def status(self) -> dict[JobStatus, int]:
        """How many of its jobs are in each status now."""
        found = self._sync()._db.run(sql.GET_WORKFLOW, {"id": self.id})
        if not found:
            raise WorkflowNotFound(f"no workflow {self.id}")
        return _counts(found[0])

    async def status_async(self) -> dict[JobStatus, int]:
        client = self._async()
        if client is not None:
            found = await client._db.run(sql.GET_WORKFLOW, {"id": self.id})
            if not found:
                raise WorkflowNotFound(f"no workflow {self.id}")
            return _counts(found[0])
        return await asyncio.to_thread(self.status)

    def wait_sync(self, timeout: float | None = None) -> dict[JobStatus, int]:
        """Block until every job of the workflow has ended (or `timeout` seconds passed);
        returns the counts by status. A job that failed or was cancelled raises nothing here:
        the counts, and each job's handle in `jobs`, say how it ended."""
        deadline = deadline_of(timeout)
        # The last nodes added usually end last: once they have, the rest read as ended.
        for job in reversed(list(self.jobs.values())):
            left = time_left(deadline)
            if left is not None and left <= 0:
                break
            # One that ended failed or cancelled raises, one deleted is gone: the counts say so.
            with contextlib.suppress(JobError, JobNotFound):
                job.wait_sync(timeout=left)
        return self.status()

    async def wait(self, timeout: float | None = None) -> dict[JobStatus, int]:
        """The async `wait_sync`."""
        deadline = deadline_of(timeout)
        for job in reversed(list(self.jobs.values())):
            left = time_left(deadline)
            if left is not None and left <= 0:
                break
            with contextlib.suppress(JobError, JobNotFound):
                await job.wait(timeout=left)
        return await self.status_async()

    def cancel(self) -> int:
        """Cancel every job of the workflow that has not ended, as `cancel` does one job (a
        running job stops at its next stage boundary, after its cleanup), except its
        finalizers (`on_parent_failure="run"` or `"run_if_failed"`), which their parents'
        outcomes settle. Returns how many jobs were cancelled or asked to stop."""
        (row,) = self._sync()._db.run(sql.CANCEL_WORKFLOW, {"id": self.id})
        return int(row.changed)

    async def cancel_async(self) -> int:
        client = self._async()
        if client is not None:
            (row,) = await client._db.run(sql.CANCEL_WORKFLOW, {"id": self.id})
            return int(row.changed)
        return await asyncio.to_thread(self.cancel)


@dataclass(frozen=True)
class WaitedParent:
    """A parent a held job still waits for (`worker show`, `worker.held_jobs`)."""

    job_id: str
    node: str | None
    task: str | None
    status: JobStatus | None  # None: no such job (it will count as deleted)


def waiting_for(client: WorkflowReader, job_id: str) -> list[WaitedParent]:
    """The parents the job still waits for, by id; none for a job that is not held."""
    return [
        WaitedParent(str(r.parent_id), r.node, r.task, JobStatus(r.status) if r.status else None)
        for r in client._db.run(sql.WAITING_FOR, {"id": job_id})
    ]


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow as `worker workflows` lists it: its jobs counted by status."""

    id: str
    name: str
    key: str | None
    created_at: datetime
    jobs: int
    counts: dict[JobStatus, int]


def _summary(r: Any) -> WorkflowSummary:
    return WorkflowSummary(str(r.id), r.name, r.key, r.created_at, int(r.jobs), _counts(r))


def list_workflows(client: WorkflowReader, limit: int) -> list[WorkflowSummary]:
    """The newest `limit` workflows, newest first."""
    return [_summary(r) for r in client._db.run(sql.LIST_WORKFLOWS, {"limit": limit})]


async def list_workflows_async(client: AsyncWorkflowReader, limit: int) -> list[WorkflowSummary]:
    """`list_workflows` on an asyncio client."""
    return [_summary(r) for r in await client._db.run(sql.LIST_WORKFLOWS, {"limit": limit})]
