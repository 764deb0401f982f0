"""`worker workflows` and `worker workflow show ID`: the workflows, and one as a tree.

A node is drawn under the last of its parents in the order the graph was added (each node
once, so a fan-in of twelve parents is not drawn twelve times); a node with other parents
says how many it waited for. What this does not do: it changes nothing.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from worker.cli.errors import fail
from worker.cli.options import AsJson
from worker.cli.output import ago, emit_json, out, styled
from worker.cli.session import client
from worker.client.workflows import WorkflowHandle, WorkflowNotFound, list_workflows
from worker.models import JobStatus

# The statuses a workflow's counts are shown in, in the order a job passes through them.
SHOWN = (
    JobStatus.HELD,
    JobStatus.PENDING,
    JobStatus.PROCESSING,
    JobStatus.PAUSED,
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
)


def _counts(counts: dict[JobStatus, int]) -> str:
    return ", ".join(f"{n} {styled(s)}" for s in SHOWN if (n := counts.get(s, 0)))


def workflows(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="How many, newest first.")] = 20,
    as_json: AsJson = False,
) -> None:
    """List workflows, newest first, with their jobs counted by status.

    Example: worker workflows --limit 5
    """
    found = list_workflows(client(), limit)
    if as_json:
        emit_json(
            [
                {
                    "id": w.id,
                    "name": w.name,
                    "key": w.key,
                    "created_at": w.created_at,
                    "jobs": w.jobs,
                    "counts": {str(s): n for s, n in w.counts.items()},
                }
                for w in found
            ]
        )
        return
    table = Table("name", "created", "jobs")
    table.add_column("id", no_wrap=True)
    for w in found:
        table.add_row(escape(w.name), ago(w.created_at), _counts(w.counts) or "none", w.id)
    out.print(table)


def _tree(handle: WorkflowHandle) -> Tree:
    counts = {s: 0 for s in SHOWN}
    for job in handle.jobs.values():
        counts[job.status] += 1
    tree = Tree(f"[bold]{escape(handle.name)}[/] {handle.id}  {_counts(counts)}")
    order = list(handle.jobs)
    branches: dict[str, Tree] = {}
    for name in order:
        job = handle.jobs[name]
        parents = handle.parents.get(name, [])
        inside = [p for p in parents if p in handle.jobs]
        label = f"{escape(name)}  {styled(job.status)}"
        if len(parents) > 1:
            label += f"  [dim]after {len(parents)}[/]"
        elif parents and not inside:
            label += f"  [dim]after job {parents[0]}[/]"
        if job.status is JobStatus.CANCELLED and job.error:
            label += f"  [dim]{escape(job.error.splitlines()[0][:60])}[/]"
        under = max(inside, key=order.index) if inside else None
        branches[name] = (branches[under] if under else tree).add(label)
    return tree


def workflow_show(
    workflow_id: Annotated[str, typer.Argument(help="The workflow's id.")],
    as_json: AsJson = False,
) -> None:
    """Show one workflow as a tree of its jobs, each with its status.

    Example: worker workflow show 0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b
    """
    from uuid import UUID

    try:
        UUID(workflow_id)
    except ValueError:
        raise fail(f"workflow id must be a UUID, not {workflow_id[:40]!r}", code=2) from None
    try:
        handle = WorkflowHandle.read(workflow_id, client())
    except WorkflowNotFound as exc:
        raise fail(str(exc)) from None
    if as_json:
        emit_json(
            {
                "id": handle.id,
                "name": handle.name,
                "key": handle.key,
                "jobs": [
                    {
                        "node": name,
                        "id": job.job_id,
                        "task": job.task,
                        "status": str(job.status),
                        "error": job.error,
                        "after": handle.parents.get(name, []),
                    }
                    for name, job in handle.jobs.items()
                ],
            }
        )
        return
    out.print(_tree(handle))


workflow_app = typer.Typer(help="One workflow: its jobs as a tree.", no_args_is_help=True)
