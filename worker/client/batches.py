"""Batches with callbacks: `enqueue_many(jobs, on_complete=..., on_failure=...)`.

A batch with a callback is a workflow (`worker.enqueue_workflow()`, migration 0014): each job
of the batch is a node with no parents, named by its index in the batch, and each callback a
node whose parents are every job of the batch. `on_complete` (policy `run`) runs once every
job has ended, however it ended; `on_failure` (policy `run_if_failed`, migration 0016) runs
then only if one of them failed for good, was cancelled or was deleted, and is cancelled as
not needed if all completed. Each is released in the transaction that records the last job's
outcome, by the rule every workflow follows. The whole batch is one statement, whatever its
width. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from worker import tracing
from worker.client.errors import InvalidJob
from worker.client.job import Job
from worker.client.validation import Batch, JobSpec, prepared_many, validated
from worker.client.workflows import WorkflowHandle
from worker.ids import new_job_id, new_job_ids
from worker.models import JSON, ParentFailure

# The most jobs a batch with a callback takes. Each callback's claim reads every job's outcome
# and result (`ctx.parents`), and every job's end takes the callback's row lock in turn: past
# this, split the work into batches, or let a callback enqueue the next one.
MAX_BATCH_JOBS = 10_000

# The name of the workflow a batch is (`worker workflows`, `GET /workflows`).
BATCH_WORKFLOW = "batch"


class _TaskLike(Protocol):
    """A task (`@task`'s handle), known here by its name alone."""

    @property
    def name(self) -> str: ...


# What `on_complete=` and `on_failure=` take: a task, a task's name, or a `JobSpec` (to give
# the callback a payload or a queue: `report.spec({"day": "2026-12-06"})`).
Callback = JobSpec | str | _TaskLike


class BatchJobs(list[Job]):
    """What `enqueue_many` returns given a callback: the batch's jobs in order, as a list, with
    the callback jobs and the workflow the batch is (its counts, a wait, a cancel).

    >>> jobs = enqueue_many(specs, on_complete=report)   # doctest: +SKIP
    >>> jobs.on_complete.wait_sync(timeout=60)           # doctest: +SKIP
    >>> jobs.workflow.status()                           # doctest: +SKIP
    """

    def __init__(
        self,
        jobs: Iterable[Job],
        workflow: WorkflowHandle,
        on_complete: Job | None,
        on_failure: Job | None,
    ) -> None:
        super().__init__(jobs)
        self.workflow = workflow
        self.on_complete = on_complete
        self.on_failure = on_failure


def _callback_spec(value: object, what: str) -> JobSpec:
    if isinstance(value, JobSpec):
        return value
    if isinstance(value, str):
        return JobSpec(value)
    name = getattr(value, "name", None)
    if callable(value) and isinstance(name, str):
        return JobSpec(name)
    raise InvalidJob(
        f"{what} must be a task, a task's name or a JobSpec, not {type(value).__name__}"
    )


@dataclass
class CallbackBatch:
    """A batch and its callbacks, every job validated, as `sql.ENQUEUE_WORKFLOW`'s parameters."""

    batch: Batch  # the batch's jobs, then its callbacks, ids in that order
    size: int  # how many of them are the batch's
    callbacks: dict[str, int]  # each callback's index in `batch`, by its name
    params: dict[str, Any]

    def named(self, jobs: list[Job]) -> dict[str, Job]:
        """Each job's handle (`jobs`, in the order of `batch`) by its node's name."""
        names = [str(k) for k in range(self.size)] + list(self.callbacks)
        return dict(zip(names, jobs, strict=True))

    def handles(self, jobs: list[Job], workflow: WorkflowHandle) -> BatchJobs:
        """The batch's handles, given each job's (`jobs`, in the order of `batch`)."""
        found = {name: jobs[i] for name, i in self.callbacks.items()}
        return BatchJobs(
            jobs[: self.size], workflow, found.get("on_complete"), found.get("on_failure")
        )


def with_callbacks(
    jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]],
    on_complete: Callback | None,
    on_failure: Callback | None,
    max_bytes: int,
) -> CallbackBatch:
    """The batch and its callbacks as one workflow, or `InvalidJob` naming what is wrong: a
    batch empty or wider than `MAX_BATCH_JOBS`, a bad job or callback, a unique key."""
    items = list(jobs)
    if len(items) > MAX_BATCH_JOBS:
        raise InvalidJob(
            f"a batch with on_complete or on_failure takes at most {MAX_BATCH_JOBS} jobs, "
            f"not {len(items)}: split it into smaller batches"
        )
    if not items:
        raise InvalidJob("a batch with on_complete or on_failure needs at least one job")
    batch = prepared_many(items, max_bytes)
    for i, row in enumerate(batch.rows):
        if row["unique_key"] is not None:
            raise InvalidJob(
                f"job {i}: unique_key is not taken in a batch with on_complete or on_failure "
                "(a live job holding the key would stand in for it, outside the batch)"
            )
    chosen = [
        (name, value, policy)
        for name, value, policy in (
            ("on_complete", on_complete, ParentFailure.RUN),
            ("on_failure", on_failure, ParentFailure.RUN_IF_FAILED),
        )
        if value is not None
    ]
    specs, rows = list(batch.specs), list(batch.rows)
    for name, value, _ in chosen:
        spec = _callback_spec(value, name)
        try:
            row = validated(spec, max_bytes)
        except InvalidJob as exc:
            raise InvalidJob(f"{name}: {exc}") from None
        if row["unique_key"] is not None:
            raise InvalidJob(f"{name}: unique_key is not taken by a batch's callback")
        specs.append(spec)
        rows.append(row)
    # Sorted, so the callbacks' ids come after the jobs' (a workflow's rows are locked in id
    # order, parents first) and `ctx.parents` lists the jobs in the batch's order.
    ids = sorted(new_job_ids(len(specs)))
    size = len(items)
    parents = ids[:size]
    node_rows = [f'{{"i":"{id_}","n":"{k}","f":"cancel","w":0}}' for k, id_ in enumerate(parents)]
    edge_rows: list[str] = []
    for (name, _, policy), child in zip(chosen, ids[size:], strict=True):
        node_rows.append(f'{{"i":"{child}","n":"{name}","f":"{policy}","w":{size}}}')
        edge_rows.extend(f'{{"c":"{child}","p":"{p}"}}' for p in parents)
    callbacks = {name: size + k for k, (name, _, _) in enumerate(chosen)}
    whole = Batch(specs, ids, rows)
    params = {
        "id": new_job_id(),
        "name": BATCH_WORKFLOW,
        "key": None,
        "jobs": whole.params()["jobs"],
        "nodes": f"[{','.join(node_rows)}]",
        "edges": f"[{','.join(edge_rows)}]",
        "trace_context": tracing.carrier(),
    }
    return CallbackBatch(whole, size, callbacks, params)
