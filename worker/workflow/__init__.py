"""Workflows across jobs: a graph declared up front (`Workflow`), written in one transaction,
each job held until its parents have ended and released in the transaction that records the
last one's outcome (the database's `worker.parents_ended()`, migration 0014); its handle
(`WorkflowHandle`, kept beside the `Job` handle in `worker.client.workflows`). A job of a
workflow reads its parents' results as `ctx.parents` and `ctx.result_of(name)`.
"""

from worker.client.workflows import WorkflowHandle, WorkflowNotFound
from worker.models import ParentFailure
from worker.workflow.graph import InvalidWorkflow, Node, Workflow

__all__ = [
    "InvalidWorkflow",
    "Node",
    "ParentFailure",
    "Workflow",
    "WorkflowHandle",
    "WorkflowNotFound",
]
