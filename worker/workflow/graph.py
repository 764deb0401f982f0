"""`Workflow`: a graph of jobs declared up front, checked whole, then written in one statement.

    wf = Workflow("export")
    tables = [wf.add(export_table, {"table": t}) for t in TABLES]
    verify = wf.add(verify_all, {}, after=tables)
    wf.add(clean_up, {}, after=[verify], on_parent_failure="run")
    handle = wf.enqueue()

A node's parents are nodes of the same workflow (by handle or by name, so a graph can name a
node added later) or jobs already enqueued (a `Job` handle or an id). A graph with a cycle, a
name used twice, a name no node has or a node of another workflow is refused with one
`InvalidWorkflow` before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from worker import tracing
from worker.client import AsyncClient, Client, InvalidJob, Job, JobSpec, default_client
from worker.client.job import new_job
from worker.client.validation import Batch, validated
from worker.client.workflows import WorkflowHandle
from worker.db import sql
from worker.db.targets import AsyncTarget, SyncTarget
from worker.encoding import dumps
from worker.ids import new_job_id, new_job_ids
from worker.models import JSON, ParentFailure

if TYPE_CHECKING:
    from worker.tasks import Task

MAX_NAME = 255


class InvalidWorkflow(InvalidJob):
    """A workflow was refused before anything was written: the message names the problem."""


@dataclass(frozen=True)
class Node:
    """One job of a workflow, as `Workflow.add` returns it: pass it in `after=` of another
    node, or to `ctx.result_of` by its `name`."""

    workflow: Workflow = field(repr=False, compare=False)
    name: str
    index: int


# What `after=` takes: a node of this workflow, a node's name, or a job already enqueued.
Parent = Node | str | Job | UUID


@dataclass
class _Entry:
    spec: JobSpec
    after: list[Parent]
    policy: ParentFailure


def _name_problem(value: object, what: str) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME or "\x00" in value:
        return f"{what} must be a string of 1 to {MAX_NAME} characters, with no NUL"
    return None


class Workflow:
    """A graph of jobs to enqueue together; see the module's docstring.

    `key` makes the workflow unique: enqueueing another with the same key writes nothing and
    returns the workflow that holds it (`duplicate` true on its handle).
    """

    def __init__(self, name: str, key: str | None = None) -> None:
        problem = _name_problem(name, "workflow name") or (
            _name_problem(key, "workflow key") if key is not None else None
        )
        if problem:
            raise InvalidWorkflow(problem)
        self.name = name
        self.key = key
        self._entries: list[_Entry] = []
        self._names: dict[str, int] = {}

    @property
    def nodes(self) -> list[Node]:
        return [Node(self, name, i) for name, i in self._names.items()]

    def add(
        self,
        task: Task[Any, Any] | str,
        payload: Any = None,
        *,
        after: Iterable[Parent] = (),
        on_parent_failure: ParentFailure | str = ParentFailure.CANCEL,
        name: str | None = None,
        **options: Any,
    ) -> Node:
        """Add a job of `task` that runs once every job in `after` has ended; returns its node.

        `options` are `enqueue`'s (queue, priority, delay, run_at, max_retries,
        concurrency_key), but `unique_key` (give the workflow a `key` instead) and
        `connection` (given to `enqueue`). `name` defaults to the task's name, numbered from
        the second job of a task on (`export.2`).
        """
        if "unique_key" in options or "connection" in options:
            given = "unique_key" if "unique_key" in options else "connection"
            hint = "give the workflow a key=" if given == "unique_key" else "pass it to enqueue()"
            raise InvalidWorkflow(f"{given} is not an option of a workflow's job: {hint}")
        try:
            policy = ParentFailure(on_parent_failure)
        except ValueError:
            raise InvalidWorkflow(
                f"on_parent_failure must be one of {', '.join(repr(str(p)) for p in ParentFailure)}"
                f", not {on_parent_failure!r}"
            ) from None
        if isinstance(task, str):
            task_name, stored, given_options = task, payload, options
        else:
            stored, given_options = task.prepared(payload, dict(options))
            task_name = task.name
        node_name = name if name is not None else self._free_name(task_name)
        problem = _name_problem(node_name, "node name")
        if problem:
            raise InvalidWorkflow(problem)
        if node_name in self._names:
            raise InvalidWorkflow(f"workflow {self.name}: node name {node_name!r} is used twice")
        parents = list(after)
        for parent in parents:
            if isinstance(parent, Node) and parent.workflow is not self:
                raise InvalidWorkflow(
                    f"workflow {self.name}: node {parent.name!r} belongs to workflow "
                    f"{parent.workflow.name!r}, not this one"
                )
        spec = JobSpec(task_name, {} if stored is None else stored, **given_options)
        self._names[node_name] = len(self._entries)
        self._entries.append(_Entry(spec, parents, policy))
        return Node(self, node_name, len(self._entries) - 1)

    def _free_name(self, task_name: str) -> str:
        if task_name not in self._names:
            return task_name
        n = 2
        while f"{task_name}.{n}" in self._names:
            n += 1
        return f"{task_name}.{n}"

    def _parents_of(self, entry: _Entry) -> tuple[list[int], list[str]]:
        """An entry's parents: indexes of this graph's nodes, and ids of jobs outside it."""
        inside: list[int] = []
        outside: list[str] = []
        for parent in entry.after:
            if isinstance(parent, Node):
                inside.append(parent.index)
            elif isinstance(parent, str) and parent in self._names:
                inside.append(self._names[parent])
            elif isinstance(parent, Job):
                outside.append(parent.job_id)
            elif isinstance(parent, UUID):
                outside.append(str(parent))
            else:
                raise InvalidWorkflow(
                    f"workflow {self.name}: no node is named {str(parent)[:80]!r}"
                )
        return sorted(set(inside)), sorted(set(outside))

    def _check_acyclic(self, parents: Sequence[list[int]]) -> None:
        """Kahn's order over the graph: the nodes left over sit on a cycle."""
        children: list[list[int]] = [[] for _ in parents]
        waiting = [len(p) for p in parents]
        for child, ps in enumerate(parents):
            for p in ps:
                children[p].append(child)
        ready = [i for i, n in enumerate(waiting) if n == 0]
        seen = 0
        while ready:
            node = ready.pop()
            seen += 1
            for child in children[node]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        if seen < len(parents):
            names = list(self._names)
            stuck = [names[i] for i, n in enumerate(waiting) if n > 0]
            raise InvalidWorkflow(
                f"workflow {self.name} has a cycle through {', '.join(stuck[:5])}"
            )

    def build(self, max_payload_bytes: int) -> tuple[dict[str, Any], list[str]]:
        """`sql.ENQUEUE_WORKFLOW`'s parameters and each node's job id, in node order; every
        job validated and the graph checked first."""
        if not self._entries:
            raise InvalidWorkflow(f"workflow {self.name} has no jobs")
        resolved = [self._parents_of(e) for e in self._entries]
        self._check_acyclic([inside for inside, _ in resolved])
        names = list(self._names)
        rows: list[dict[str, Any]] = []
        for name, entry in zip(names, self._entries, strict=True):
            try:
                rows.append(validated(entry.spec, max_payload_bytes))
            except InvalidJob as exc:
                raise InvalidWorkflow(f"workflow {self.name}: node {name!r}: {exc}") from None
        # Sorted, so ids (and the order of `ctx.parents`) follow the order nodes were added.
        ids = sorted(new_job_ids(len(rows)))
        batch = Batch([e.spec for e in self._entries], ids, rows)
        nodes: list[dict[str, JSON]] = []
        edges: list[dict[str, str]] = []
        for i, (entry, (inside, outside)) in enumerate(zip(self._entries, resolved, strict=True)):
            parent_ids = [ids[p] for p in inside] + outside
            nodes.append({"i": ids[i], "n": names[i], "f": str(entry.policy), "w": len(parent_ids)})
            edges.extend({"c": ids[i], "p": p} for p in parent_ids)
        params = {
            "id": new_job_id(),
            "name": self.name,
            "key": self.key,
            "jobs": batch.params()["jobs"],
            "nodes": dumps(nodes),
            "edges": dumps(edges),
            "trace_context": tracing.carrier(),
        }
        return params, ids

    def _handle(
        self, client: Client | AsyncClient, params: dict[str, Any], ids: list[str], row: Any
    ) -> WorkflowHandle:
        workflow_id, created = row
        if not created:
            return WorkflowHandle(str(workflow_id), self.name, self.key, {}, client, duplicate=True)
        jobs = {
            name: new_job(job_id, entry.spec, client)
            for name, job_id, entry in zip(self._names, ids, self._entries, strict=True)
        }
        return WorkflowHandle(str(workflow_id), self.name, self.key, jobs, client)

    def enqueue(
        self, *, client: Client | None = None, connection: SyncTarget = None
    ) -> WorkflowHandle:
        """Write every job and edge in one transaction (the caller's, with `connection=`, a
        SQLAlchemy `Connection` or `Session` or a psycopg connection); returns its handle."""
        client = client or default_client()
        params, ids = self.build(client.max_payload_bytes)
        statement = sql.ENQUEUE_WORKFLOW  # idempotent by the workflow's id: safe to run again
        (row,) = client._db.insert(statement, statement, params, connection, True)
        handle = self._handle(client, params, ids, row)
        return handle.refreshed() if handle.duplicate else handle

    async def enqueue_async(
        self, *, client: AsyncClient, connection: AsyncTarget = None
    ) -> WorkflowHandle:
        """`enqueue` on an `AsyncClient` (and an async connection of the caller's)."""
        params, ids = self.build(client.max_payload_bytes)
        statement = sql.ENQUEUE_WORKFLOW
        (row,) = await client._db.insert(statement, statement, params, connection, True)
        handle = self._handle(client, params, ids, row)
        return await handle.refreshed_async() if handle.duplicate else handle

    @staticmethod
    def get(workflow_id: str | UUID, *, client: Client | None = None) -> WorkflowHandle:
        """A handle on a workflow enqueued anywhere; `LookupError` if there is none."""
        return WorkflowHandle.read(str(workflow_id), client or default_client())
