"""Retention deletes a workflow's jobs only once all of them have ended, whoever prunes
(`cleanup_jobs`, `worker prune`, a worker's retention duty); deleting a job by hand never
strands a dependent. Against a real PostgreSQL; jobs are ended with SQL at chosen ages, on a
queue no worker serves."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from support import Processes, query, wait_for
from typer.testing import CliRunner

from worker import Client, Workflow, cli
from worker.settings import get_settings
from worker.workflow import WorkflowNotFound

NOBODY = "nobody-serves-this"


def _end(url: str, job_id: str, status: str = "completed", ago: str = "10 days") -> None:
    query(
        url,
        "UPDATE worker.jobs SET status = %s, finished_at = now() - %s::interval WHERE id = %s",
        (status, ago, job_id),
    )


def _exists(url: str, job_id: str) -> bool:
    return bool(query(url, "SELECT count(*) FROM worker.jobs WHERE id = %s", (job_id,))[0][0])


def _stranded(url: str) -> list[str]:
    """Held jobs that wait for a parent that has ended or is gone: none may ever be."""
    rows = query(
        url,
        "SELECT DISTINCT c.id::text FROM worker.jobs AS c "
        "JOIN worker.job_dependencies AS d ON d.child_id = c.id AND d.ended_as IS NULL "
        "LEFT JOIN worker.jobs AS p ON p.id = d.parent_id "
        "WHERE c.status = 'held' AND (p.id IS NULL OR p.status IN "
        "('completed', 'failed', 'cancelled'))",
    )
    return [r[0] for r in rows]


def _by_client(url: str, processes: Processes, env: dict[str, str]) -> None:
    Client(url).cleanup_jobs(older_than="7d")


def _cli(url: str, *args: str) -> str:
    """Run `worker ARGS` against `url`, with no WORKER_* setting of this process; its stdout."""
    mp = pytest.MonkeyPatch()
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            mp.delenv(name)
    mp.setenv("DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli.app, list(args))
    finally:
        mp.undo()
        get_settings.cache_clear()
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def _by_cli(url: str, processes: Processes, env: dict[str, str]) -> None:
    _cli(url, "prune", "--older-than", "7d", "--yes")


def _by_duty(url: str, processes: Processes, env: dict[str, str]) -> None:
    """A worker's retention duty, until it has pruned a marker job: a whole pass has run."""
    marker = Client(url).enqueue("part", {"n": 0}, queue=NOBODY).job_id
    _end(url, marker)
    processes.worker(env, "workflowtasks", extra={"WORKER_RETENTION_INTERVAL": "0.3"})
    wait_for(lambda: not _exists(url, marker), message="a retention pass")
    for proc in processes.procs:
        proc.terminate()
        proc.wait(timeout=30)
    processes.procs.clear()


PRUNERS: dict[str, Callable[[str, Processes, dict[str, str]], None]] = {
    "cleanup_jobs": _by_client,
    "worker prune": _by_cli,
    "retention duty": _by_duty,
}


@pytest.mark.parametrize("pruner", sorted(PRUNERS))
def test_retention_deletes_a_workflow_s_jobs_only_once_all_of_them_have_ended(
    env, database_url, processes: Processes, pruner
):
    prune = PRUNERS[pruner]
    client = Client(database_url)
    wf = Workflow("nightly", key="nightly-1")
    first = wf.add("part", {"n": 1}, name="first", queue=NOBODY)
    wf.add("part", {"n": 2}, name="second", queue=NOBODY, after=[first])
    handle = wf.enqueue(client=client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}
    # Outside any workflow: a job enqueued in SQL to wait for an old finished job.
    old = client.enqueue("part", {"n": 3}, queue=NOBODY).job_id
    _end(database_url, old)
    (waits,) = query(
        database_url,
        "SELECT worker.enqueue('part', '{}', %s, depends_on => ARRAY[%s]::uuid[])",
        (NOBODY, old),
    )[0]
    _end(database_url, ids["first"])
    assert (
        query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", (ids["second"],))[0][0]
        == "pending"
    )

    prune(database_url, processes, env)
    # The second job has not ended: the first, ended long ago, is kept with it; so is the old
    # job a pending job waits for.
    assert _exists(database_url, ids["first"]) and _exists(database_url, old)

    _end(database_url, ids["second"], "failed")
    _end(database_url, str(waits))
    prune(database_url, processes, env)
    assert not any(_exists(database_url, i) for i in [*ids.values(), old, str(waits)])
    # The workflow went with its last job, and its key with it.
    with pytest.raises(WorkflowNotFound):
        Workflow.get(handle.id, client=client)
    again = Workflow("nightly", key="nightly-1")
    again.add("part", {"n": 1}, queue=NOBODY)
    assert not again.enqueue(client=client).duplicate


def test_worker_prune_dry_run_counts_only_what_it_would_delete(database_url):
    wf = Workflow("nightly")
    first = wf.add("part", {"n": 1}, name="first", queue=NOBODY)
    wf.add("part", {"n": 2}, name="second", queue=NOBODY, after=[first])
    handle = wf.enqueue(client=Client(database_url))
    _end(database_url, handle.jobs["first"].job_id)
    shown = _cli(database_url, "prune", "--older-than", "7d", "--dry-run")
    assert "would remove 0 finished jobs" in shown


def test_deleting_a_job_by_hand_never_strands_a_dependent(database_url):
    client = Client(database_url)
    wf = Workflow("by hand")
    a = wf.add("part", {"n": 1}, name="a", queue=NOBODY)
    b = wf.add("part", {"n": 2}, name="b", queue=NOBODY, after=[a])
    c = wf.add("fan_in", {}, name="c", queue=NOBODY, after=[b])
    wf.add("finalize", {}, name="d", queue=NOBODY, after=[c], on_parent_failure="run")
    x = wf.add("part", {"n": 3}, name="x", queue=NOBODY)
    y = wf.add("part", {"n": 4}, name="y", queue=NOBODY, after=[x])
    wf.add("fan_in", {}, name="z", queue=NOBODY, after=[x, y])
    p = wf.add("part", {"n": 5}, name="p", queue=NOBODY)
    q = wf.add("part", {"n": 6}, name="q", queue=NOBODY)
    wf.add("fan_in", {}, name="r", queue=NOBODY, after=[p, q])
    handle = wf.enqueue(client=client)
    ids = {name: job.job_id for name, job in handle.jobs.items()}

    def status(name: str) -> str | None:
        rows = query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", (ids[name],))
        return str(rows[0][0]) if rows else None

    # The middle of a chain, held: its child is cancelled, the finalizer after that released.
    query(database_url, "DELETE FROM worker.jobs WHERE id = %s", (ids["b"],))
    assert (status("c"), status("d")) == ("cancelled", "pending")
    assert _stranded(database_url) == []
    # A parent and one of its children in one statement: the other child still settles.
    query(
        database_url,
        "DELETE FROM worker.jobs WHERE id = ANY(%s::uuid[])",
        ([ids["x"], ids["y"]],),
    )
    assert status("z") == "cancelled"
    # A finished parent: its child had counted it already, and waits for the rest only.
    _end(database_url, ids["p"])
    query(database_url, "DELETE FROM worker.jobs WHERE id = %s", (ids["p"],))
    assert status("r") == "held" and _stranded(database_url) == []
    _end(database_url, ids["q"])
    assert status("r") == "pending"
    assert query(database_url, "SELECT count(*) FROM worker.held_jobs")[0][0] == 0

    query(database_url, "DELETE FROM worker.jobs WHERE workflow_id = %s", (handle.id,))
    with pytest.raises(WorkflowNotFound):
        Workflow.get(handle.id, client=client)
